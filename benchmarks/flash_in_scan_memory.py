"""Compiled temporaries of blockwise (flash) attention's gradient inside `lax.scan` over layers.

An open problem found on 2026-11-25: with layers scanned (`model.scan_layers`, which the 151M and
1B presets use), the gradient's XLA temporaries grow super-linearly in T, while the same two
layers unrolled grow linearly and the residuals the scan saves are linear
(`jax.ad_checkpoint.print_saved_residuals`: q, k, v, output and log-sum-exp per layer).

  JAX_PLATFORMS=cpu python benchmarks/flash_in_scan_memory.py [--lengths 4096,8192] [--block 512]

prints, for 2 layers of attention (B 1, H 4, Dh 32, block 512) at 4k and 8k tokens, the
temporaries of the compiled gradient: scanned, unrolled, scanned non-causal (no causal block
skipping), and the scanned forward alone.
"""

import argparse

import jax
import jax.numpy as jnp

from bipe_jax import attention

HEADS, HEAD_DIM = 4, 32


def temporaries_mib(length: int, *, scanned: bool, causal: bool, gradient: bool,
                    block: int = 512) -> float:
  positions = jnp.arange(length)[None]

  def attend(x):
    mask = attention.AttentionMask(q_pos=positions, k_pos=positions, causal=causal)
    return attention.blockwise_attention(x, x * 0.5, x * 0.25, mask=mask, block_size=block)

  def loss(x):
    if scanned:
      x, _ = jax.lax.scan(lambda c, _: (c + attend(c), None), x, None, length=2)
    else:
      x = x + attend(x)
      x = x + attend(x)
    return jnp.sum(x)

  fn = jax.grad(loss) if gradient else loss
  arg = jax.ShapeDtypeStruct((1, HEADS, length, HEAD_DIM), jnp.float32)
  return jax.jit(fn).lower(arg).compile().memory_analysis().temp_size_in_bytes / 2 ** 20


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--lengths', default='4096,8192', help='the two lengths compared')
  p.add_argument('--block', type=int, default=512)
  args = p.parse_args(argv)
  short, long = (int(n) for n in args.lengths.split(','))
  cases = {'scanned gradient': dict(scanned=True, causal=True, gradient=True),
           'unrolled gradient': dict(scanned=False, causal=True, gradient=True),
           'scanned gradient, non-causal': dict(scanned=True, causal=False, gradient=True),
           'scanned forward': dict(scanned=True, causal=True, gradient=False)}
  print(f'{"case":32s} {f"{short} MiB":>9s} {f"{long} MiB":>9s} {"ratio":>6s}')
  for name, kw in cases.items():
    small = temporaries_mib(short, block=args.block, **kw)
    large = temporaries_mib(long, block=args.block, **kw)
    print(f'{name:32s} {small:9.1f} {large:9.1f} {large / small:6.2f}')


if __name__ == '__main__':
  main()
