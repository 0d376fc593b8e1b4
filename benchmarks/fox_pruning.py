"""FoX's computation pruning on the blockwise path: blocks skipped and attention step speed-up.

Run:  .venv/bin/python benchmarks/fox_pruning.py --lengths 4096,8192,16384

One attention layer's forward + backward (blockwise, flash VJP), B=1, H heads of Dh, q and k
~ N(0, 1), with data-independent forget gates of per-head decay times tau (log f = -1 / tau):
'local' gives every head tau = 64 tokens, 'mixed' log-spaces tau over [16, 4096] (the official
initialisation's range). The step is timed with and without `model.fox_log_pruning_tolerance`
(-10, the official recommendation); the skipped fraction counts the causal (query block, key
block) pairs whose bias bound max c_q - min c_k lies below FoX's threshold -(2U + log T) - 10
for every head (the blockwise loops decide once per block, over all heads: a slow head keeps
its blocks).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks import common  # pylint: disable=g-import-not-at-top
from bipe_jax import attention  # pylint: disable=g-import-not-at-top
from bipe_jax.encodings import fox  # pylint: disable=g-import-not-at-top


def decay_times(kind: str, heads: int) -> np.ndarray:
  if kind == 'local':
    return np.full(heads, 64.0)
  return np.exp(np.linspace(np.log(16.0), np.log(4096.0), heads))


def skipped_fraction(c_TxH, q, k, block: int, log_tolerance: float) -> float:
  """Fraction of the causal block pairs the blockwise loops skip (same rule as the code)."""
  threshold = float(fox.pruning_threshold(q, k, k.shape[2], log_tolerance))
  n = c_TxH.shape[0] // block
  blocks = c_TxH.reshape(n, block, -1)
  top, bottom = blocks.max(axis=(1, 2)), blocks.min(axis=(1, 2))
  pairs = [(i, j) for i in range(n) for j in range(i + 1)]
  return sum(top[i] - bottom[j] < threshold for i, j in pairs) / len(pairs)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--lengths', default='4096,8192,16384')
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--head_dim', type=int, default=64)
  p.add_argument('--block_size', type=int, default=512)
  p.add_argument('--log_tolerance', type=float, default=-10.0)
  p.add_argument('--gates', default='local,mixed')
  p.add_argument('--repeats', type=int, default=3)
  args = p.parse_args(argv)
  rows = []
  for length in [int(x) for x in args.lengths.split(',')]:
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(1, args.heads, length, args.head_dim)), jnp.float32)
               for _ in range(3))
    pos = jnp.arange(length)[None]
    for gates in args.gates.split(','):
      c = -np.arange(1, length + 1)[:, None] / decay_times(gates, args.heads)[None, :]
      c_streams = jnp.asarray(c[None], jnp.float32)

      def step(prune, q=q, k=k, v=v, c_streams=c_streams):
        def loss(q, k, v, c):
          out = attention.blockwise_attention(
              q, k, v, mask=attention.AttentionMask.causal_from_positions(pos), q_streams=c,
              k_streams=c, bias_fn=fox.fox_bias,
              block_size=args.block_size,
              block_prune=fox.block_prune(args.log_tolerance) if prune else None)
          return jnp.sum(out * out)
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))

      fns = {name: (lambda f=step(prune): f(q, k, v, c_streams))
             for name, prune in (('full', False), ('pruned', True))}
      load = common.load_average()
      cpu = {}
      times = common.interleaved(fns, warmup=1, repeats=args.repeats, cpu_out=cpu)
      frac = skipped_fraction(c, q, k, args.block_size, args.log_tolerance)
      rows.append([length, gates, f'{frac:.1%}', common.fmt_ms(common.median(times['full'])),
                   common.fmt_ms(common.median(times['pruned'])),
                   f"{common.median(times['full']) / common.median(times['pruned']):.2f}x",
                   f"{common.median(cpu['full']) / common.median(cpu['pruned']):.2f}x",
                   f'{load:.1f}'])
      print(rows[-1], flush=True)
  print(common.machine_line())
  print(common.markdown_table(['tokens', 'gates', 'causal blocks skipped', 'step (full)',
                               'step (pruned)', 'speed-up (wall)', 'speed-up (CPU s)',
                               'load before'], rows))


if __name__ == '__main__':
  main()
