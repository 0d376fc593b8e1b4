"""Two parts of the training step, each against the plain form it replaced, on one thread.

Run:  .venv/bin/python benchmarks/head_and_weight_gradient.py [--tokens 2048] [--repeats 15]
      [--out benchmarks/results/head_and_weight_gradient]

1. The lm head and next-token loss (value and gradients in hidden and kernel, width 128, vocab
   4096): the materialised logits with train_step.token_nll against
   chunked_loss.lm_head_nll_sum at several chunk sizes (training/chunked_loss.py).
2. A projection's forward and backward (x @ w, gradients in x and w) through `jnp.matmul`
   against bipe_jax.kernels.cpu_matmul.matmul_2d (weight gradient x^T dy in the kernel's layout; until
   2026-11-25 it computed dy^T x transposed for kernels wider in than out, which the stored
   results measured). On one device both forms compile alike; the layout matters under data
   parallelism (benchmarks/README.md, 2026-11-25 afternoon).

`--tokens` is the tokens of one device (the tiny benchmark shape, 32 x 128 over 2 devices:
2,048), on one thread: what each of `--cpu_devices=2`'s two busy devices gets of the cores.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top
from bipe_jax.kernels import cpu_devices  # pylint: disable=g-import-not-at-top

WIDTH, VOCAB = 128, 4096
CHUNKS = (128, 256, 512, 1024)
PROJECTIONS = ((128, 512), (512, 128), (128, 128), (768, 3072), (3072, 768))


def head_candidates(tokens: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bipe_jax.kernels import cpu_matmul as matmul  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import chunked_loss  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import train_step  # pylint: disable=g-import-not-at-top
  k = jax.random.split(jax.random.PRNGKey(0), 3)
  hidden = jax.random.normal(k[0], (1, tokens, WIDTH))
  kernel = jax.random.normal(k[1], (WIDTH, VOCAB)) * 0.05
  targets = jax.random.randint(k[2], (1, tokens), 0, VOCAB)
  weights = jnp.ones((1, tokens), jnp.float32)

  def plain(h, w):
    logits = matmul.matmul_einsum('btd,dv->btv', h, w)  # as the model's lm_head computes them
    return jnp.sum(train_step.token_nll(logits, targets) * weights)

  def chunked(c):
    return lambda h, w: chunked_loss.lm_head_nll_sum(h, w, targets, weights, c)

  fns = {'materialised logits': plain}
  fns.update({f'chunks of {c} tokens': chunked(c) for c in CHUNKS if c <= tokens})
  out = {}
  for name, fn in fns.items():
    step = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))
    out[name] = lambda step=step: step(hidden, kernel)
  return out


def projection_candidates(tokens: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bipe_jax.kernels import cpu_matmul as matmul  # pylint: disable=g-import-not-at-top
  out = {}
  for d_in, d_out in PROJECTIONS:
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    x = jax.random.normal(k[0], (tokens, d_in))
    w = jax.random.normal(k[1], (d_in, d_out)) * 0.05
    r = jax.random.normal(k[2], (tokens, d_out))
    for label, mm in (('jnp.matmul', jnp.matmul), ('matmul_2d', matmul.matmul_2d)):
      step = jax.jit(jax.grad(lambda x, w, mm=mm, r=r: jnp.sum(mm(x, w) * r), argnums=(0, 1)))
      out[f'{d_in} -> {d_out}: {label}'] = lambda step=step, x=x, w=w: step(x, w)
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--tokens', type=int, default=2048)
  p.add_argument('--repeats', type=int, default=15)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  # One device on one thread, set before JAX starts (the CPU client sizes one pool for all its
  # devices, so a lone busy device of `use_cpu_devices(2)` would run on both cores).
  os.environ.update(cpu_devices.single_thread_environment(os.environ))
  cpu = {}
  head = common.interleaved(head_candidates(args.tokens), repeats=args.repeats)
  base = 'materialised logits'
  rows = [[n, common.fmt_ms(common.median(t)), f'{common.paired_ratio(head, n, base):.2f}']
          for n, t in head.items()]
  proj = common.interleaved(projection_candidates(args.tokens), repeats=args.repeats,
                            cpu_out=cpu)
  for n, t in proj.items():
    shape, label = n.split(': ')
    ratio = common.paired_ratio(proj, n, f'{shape}: jnp.matmul')
    rows.append([f'projection {n}', common.fmt_ms(common.median(t)), f'{ratio:.2f}'])
  table = common.markdown_table(['candidate (value and gradients)', 'median (ms)',
                                 'time / plain form'], rows)
  common.report(f'Head + loss in chunks, and the weight-gradient form ({args.tokens} tokens, '
                'one thread)', table,
                [f'{args.repeats} interleaved rounds per part; time / plain form = median of '
                 'per-round ratios against the materialised logits or jnp.matmul (< 1: faster)'],
                out=args.out, data={'head': head, 'projections': proj})


if __name__ == '__main__':
  main()
