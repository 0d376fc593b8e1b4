"""Where attention time goes on XLA CPU: one causal attention layer, several formulations.

Run:  .venv/bin/python benchmarks/attention_layouts.py [--batch 32 --seq 128 --heads 4 --head_dim 32]

Measures the attention layouts (benchmarks/results/attention_layouts.md: einsum in [b,q,h,d] vs [b,h,q,d]
layout, jax.nn.dot_product_attention, batched matmul, PyTorch SDPA when torch is
installed) and adds the library's own `bipe_jax.attention` dense and blockwise paths
once they exist. Forward = outputs ready; forward+backward = gradients w.r.t. q, k, v of
sum(out * cotangent). All candidates are timed interleaved; medians of repeats.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top


def _jax_variants(scale: float) -> dict[str, tuple[str, Callable]]:
  """name -> (input layout 'bqhd'|'bhqd', fn(q, k, v) -> out in the same layout)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def causal(t):
    return jnp.tril(jnp.ones((t, t), bool))

  def einsum_bqhd(q, k, v):
    s = jnp.einsum('bqhd,bkhd->bhqk', q, k) * scale
    s = jnp.where(causal(q.shape[1]), s, -1e30)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum('bhqk,bkhd->bqhd', p, v)

  def einsum_bhqd(q, k, v):
    s = jnp.einsum('bhqd,bhkd->bhqk', q, k) * scale
    s = jnp.where(causal(q.shape[2]), s, -1e30)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum('bhqk,bhkd->bhqd', p, v)

  def transpose_then_bhqd(q, k, v):
    t = lambda x: x.transpose(0, 2, 1, 3)
    return t(einsum_bhqd(t(q), t(k), t(v)))

  def nn_dpa(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                        implementation='xla')

  def batched_matmul(q, k, v):
    b, h, t, d = q.shape
    qf, kf, vf = (x.reshape(b * h, t, d) for x in (q, k, v))
    s = jnp.matmul(qf, kf.transpose(0, 2, 1)) * scale
    s = jnp.where(causal(t), s, -1e30)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.matmul(p, vf).reshape(b, h, t, d)

  def manual_softmax_bhqd(q, k, v):
    # Max-subtracted exp with the normalisation applied after p@v (T/Dh fewer divides).
    s = jnp.einsum('bhqd,bhkd->bhqk', q, k) * scale
    s = jnp.where(causal(q.shape[2]), s, -1e30)
    m = jax.lax.stop_gradient(s.max(-1, keepdims=True))
    e = jnp.exp(s - m)
    return jnp.einsum('bhqk,bhkd->bhqd', e, v) / e.sum(-1, keepdims=True)

  return {
      'einsum [b,q,h,d]': ('bqhd', einsum_bqhd),
      'einsum [b,q,h,d] transposed to [b,h,q,d]': ('bqhd', transpose_then_bhqd),
      'einsum [b,h,q,d]': ('bhqd', einsum_bhqd),
      'einsum [b,h,q,d], normalise after p@v': ('bhqd', manual_softmax_bhqd),
      "jax.nn.dot_product_attention('xla') [b,q,h,d]": ('bqhd', nn_dpa),
      'batched jnp.matmul over b*h': ('bhqd', batched_matmul),
  }


def _library_variants(block_size: int) -> dict[str, tuple[str, Callable]]:
  """bipe_jax.attention dense and blockwise, when the module exists."""
  try:
    from bipe_jax import attention  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {}
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def call(fn, **kw):
    def f(q, k, v):
      b, _, t, dh = q.shape
      pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
      mask = attention.AttentionMask.causal_from_positions(pos)
      return fn(q, k, v, mask=mask, scale=dh ** -0.5, **kw)
    return f

  out = {'bipe_jax.attention.dense_attention': ('bhqd', call(attention.dense_attention))}
  if hasattr(attention, 'blockwise_attention'):
    out[f'bipe_jax.attention.blockwise_attention (block {block_size})'] = (
        'bhqd', call(attention.blockwise_attention, block_size=block_size))
  return out


def _torch_variant(b: int, h: int, t: int, d: int, threads: int):
  """(forward, forward+backward) closures for torch SDPA, or None without torch."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  torch.set_num_threads(threads)
  g = torch.Generator().manual_seed(0)
  q, k, v = (torch.randn(b, h, t, d, generator=g, requires_grad=True) for _ in range(3))
  ct = torch.randn(b, h, t, d, generator=g)
  sdpa = torch.nn.functional.scaled_dot_product_attention

  def fwd():
    with torch.no_grad():
      return sdpa(q, k, v, is_causal=True)

  def fwd_bwd():
    out = sdpa(q, k, v, is_causal=True)
    return torch.autograd.grad((out * ct).sum(), (q, k, v))

  return fwd, fwd_bwd


def measure(b: int, t: int, h: int, d: int, *, block_size: int, warmup: int, repeats: int,
            threads: int = 2, include_torch: bool = True) -> list[dict]:
  """Returns one dict per formulation: name, forward_s, fwd_bwd_s (medians)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  scale = d ** -0.5
  variants = {**_jax_variants(scale), **_library_variants(block_size)}
  keys = jax.random.split(jax.random.key(0), 4)
  base = [jax.random.normal(kk, (b, h, t, d), jnp.float32) for kk in keys]
  fns = {}
  ref = None
  for name, (layout, fn) in variants.items():
    args = base if layout == 'bhqd' else [x.transpose(0, 2, 1, 3) for x in base]
    q, k, v, ct = args
    fwd = jax.jit(fn)
    vjp = jax.jit(lambda q, k, v, ct, fn=fn: jax.vjp(fn, q, k, v)[1](ct))
    out = fwd(q, k, v)
    out_bhqd = out if layout == 'bhqd' else out.transpose(0, 2, 1, 3)
    if ref is None:
      ref = out_bhqd
    err = float(jnp.max(jnp.abs(out_bhqd - ref)))
    if err > 1e-4:
      raise AssertionError(f'{name} disagrees with the reference by {err}')
    fns[name + '|fwd'] = lambda f=fwd, a=(q, k, v): f(*a)
    fns[name + '|fwdbwd'] = lambda f=vjp, a=(q, k, v, ct): f(*a)
  torch_fns = _torch_variant(b, h, t, d, threads) if include_torch else None
  if torch_fns:
    fns['PyTorch scaled_dot_product_attention (causal)|fwd'] = torch_fns[0]
    fns['PyTorch scaled_dot_product_attention (causal)|fwdbwd'] = torch_fns[1]
  times = common.interleaved(fns, warmup=warmup, repeats=repeats)
  rows = {}
  for key, ts in times.items():
    name, kind = key.split('|')
    rows.setdefault(name, {'name': name})[kind] = common.median(ts)
  return list(rows.values())


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--batch', type=int, default=32)
  p.add_argument('--seq', type=int, default=128)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--head_dim', type=int, default=32)
  p.add_argument('--block_size', type=int, default=64)
  p.add_argument('--warmup', type=int, default=3)
  p.add_argument('--repeats', type=int, default=10)
  p.add_argument('--no_torch', action='store_true')
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  rows = measure(args.batch, args.seq, args.heads, args.head_dim, block_size=args.block_size,
                 warmup=args.warmup, repeats=args.repeats, include_torch=not args.no_torch)
  table = common.markdown_table(
      ['attention formulation', 'forward (ms)', 'forward + backward (ms)'],
      [[r['name'], common.fmt_ms(r['fwd']), common.fmt_ms(r['fwdbwd'])] for r in rows])
  common.report(f'One causal attention layer: batch {args.batch}, {args.seq} tokens, '
                f'{args.heads} heads of {args.head_dim}', table, out=args.out, data=rows)


if __name__ == '__main__':
  main()
