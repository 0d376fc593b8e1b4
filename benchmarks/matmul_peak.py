"""The limit: matmul FLOP/s of this machine through `jax.jit(lambda a, b: a @ b)`.

Run:  .venv/bin/python benchmarks/matmul_peak.py [--repeats 10] [--out benchmarks/results/matmul_peak]

FLOPs of an [m, k] @ [k, n] product are 2*m*k*n. The "peak" used for model-FLOPs
utilisation (benchmarks/mfu.py) is the best float32 figure over the square shapes.
Besides square products the table holds the shapes a narrow transformer actually
runs (projections of 4096 tokens x width 128, the unembedding to a 4096 vocabulary).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top

# (m, k, n, what it stands for)
SHAPES = (
    (512, 512, 512, 'square 512'),
    (1024, 1024, 1024, 'square 1024'),
    (2048, 2048, 2048, 'square 2048'),
    (4096, 128, 512, 'FFN up, tiny (4096 tok x 128 -> 512)'),
    (4096, 512, 128, 'FFN down, tiny (512 -> 128)'),
    (4096, 128, 128, 'q/k/v/out proj, tiny (128 -> 128)'),
    (4096, 128, 4096, 'unembedding, tiny (128 -> vocab 4096)'),
    (4096, 768, 3072, 'FFN up, 151M (768 -> 3072)'),
)


def matmul_flops_per_s(m: int, k: int, n: int, dtype: str, *, warmup: int,
                       repeats: int) -> float:
  """Median FLOP/s of a jitted [m,k]@[k,n] product in `dtype` (float32 or bfloat16)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  if dtype not in ('float32', 'bfloat16'):
    raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (m, k), jnp.float32).astype(dtype)
  b = jax.random.normal(kb, (k, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda x, y: x @ y)
  times = common.time_fn(lambda: f(a, b), warmup=warmup, repeats=repeats)
  return 2.0 * m * k * n / common.median(times)


def measure_peak(*, warmup: int = 3, repeats: int = 10) -> float:
  """Best float32 FLOP/s over the square shapes (the figure MFU divides by)."""
  return max(matmul_flops_per_s(s, s, s, 'float32', warmup=warmup, repeats=repeats)
             for s in (1024, 2048))


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--warmup', type=int, default=3)
  p.add_argument('--repeats', type=int, default=10)
  p.add_argument('--dtypes', default='float32,bfloat16')
  p.add_argument('--out', default=None, help='path prefix for .md/.json results')
  p.add_argument('--max_dim', type=int, default=0,
                 help='only the shapes whose every dimension is at most this (0: all)')
  args = p.parse_args(argv)
  import jax  # pylint: disable=g-import-not-at-top,unused-import
  dtypes = args.dtypes.split(',')
  shapes = [s for s in SHAPES if not args.max_dim or max(s[:3]) <= args.max_dim]
  if not shapes:
    p.error(f'--max_dim={args.max_dim} leaves no shape (the smallest is 512)')
  rows, data = [], []
  for m, k, n, what in shapes:
    row = [what, f'{m}x{k} @ {k}x{n}']
    for dt in dtypes:
      fps = matmul_flops_per_s(m, k, n, dt, warmup=args.warmup, repeats=args.repeats)
      row.append(f'{fps / 1e9:.0f}')
      data.append({'m': m, 'k': k, 'n': n, 'dtype': dt, 'flops_per_s': fps})
    rows.append(row)
  f32_square = [d['flops_per_s'] for d in data
                if d['dtype'] == 'float32' and d['m'] == d['k'] == d['n'] >= 1024]
  peak = max(f32_square) if f32_square else float('nan')
  table = common.markdown_table(
      ['shape', 'product'] + [f'{d} GFLOP/s' for d in dtypes], rows)
  common.report('Matmul peak (jax.jit, median of repeats)', table,
                [f'float32 peak used for MFU: {peak / 1e9:.0f} GFLOP/s '
                 '(best square shape >= 1024)'],
                out=args.out, data={'rows': data, 'float32_peak': peak})


if __name__ == '__main__':
  main()
