"""Cost of each positional encoding: training-step time of every scheme against `rope`.

Run:  .venv/bin/python benchmarks/encoding_cost.py --preset tiny
      .venv/bin/python benchmarks/encoding_cost.py --preset small
      (--encodings rope,bipe_rope,... for a subset; --attention_impl dense|blockwise)

Every encoding name of bipe_jax.schemes.SCHEME_NAMES is built at the same preset and
sequence length with the project's own training step (benchmarks/jax_step.py), all
compiled first, then timed interleaved (one step of each per round, order rotated).
The ratio column is the median over rounds of step(name) / step(rope) measured in the
same round. Targets (issue 6): bipe_rope within 3% of rope, bipe_alibi within 10% of
alibi.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top
from benchmarks import jax_step  # pylint: disable=g-import-not-at-top

TARGETS = {'bipe_rope': ('rope', 1.03), 'bipe_alibi': ('alibi', 1.10)}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--preset', default='tiny')
  p.add_argument('--encodings', default='all', help="comma list or 'all'")
  p.add_argument('--attention_impl', default='', help="'' = the preset's")
  p.add_argument('--cpu_devices', type=int, default=2,
                 help='single-threaded CPU devices the steps run data-parallel on')
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--repeats', type=int, default=10)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  devices = jax_step.use_cpu_devices(args.cpu_devices)
  from bipe_jax import schemes  # pylint: disable=g-import-not-at-top
  names = (list(schemes.SCHEME_NAMES) if args.encodings == 'all'
           else args.encodings.split(','))
  for n in names:
    schemes.get_scheme(n)  # clear error for an unknown name
  if 'rope' not in names:
    names.insert(0, 'rope')
  needed = {b for n, (b, _) in TARGETS.items() if n in names}
  names += [b for b in sorted(needed) if b not in names]
  overrides = {}
  if args.attention_impl:
    overrides['model.attention_impl'] = args.attention_impl
  steps, fns = {}, {}
  for n in names:
    s = jax_step.make_project_step(args.preset, {**overrides, 'model.position_encoding': n},
                                   devices=devices)
    s.step()
    steps[n] = s
    fns[n] = s.step
    print(f'compiled {n}', file=sys.stderr, flush=True)
  cpu = {}
  times = common.interleaved(fns, warmup=args.warmup, repeats=args.repeats, cpu_out=cpu)
  base = common.median(times['rope'])
  rows, data = [], []
  for n in names:
    ratio = common.paired_ratio(times, n, 'rope')
    cpu_ratio = common.paired_ratio(cpu, n, 'rope')
    target = ''
    if n in TARGETS:
      ref, limit = TARGETS[n]
      r_ref = common.paired_ratio(times, n, ref)
      target = f'{r_ref:.3f} x {ref} (target <= {limit:.2f}: {"met" if r_ref <= limit else "MISSED"})'
    t = common.median(times[n])
    rows.append([n, f'{steps[n].num_params / 1e6:.3f}M', common.fmt_ms(t),
                 f'{common.spread(times[n]) * 100:.0f}%', f'{ratio:.3f}', f'{cpu_ratio:.3f}',
                 target])
    data.append({'encoding': n, 'times': times[n], 'cpu_times': cpu[n],
                 'ratio_vs_rope': ratio, 'cpu_ratio_vs_rope': cpu_ratio})
  cfg = steps['rope'].config
  shape = (f'{args.preset}: {cfg.model.num_layers} layers, width {cfg.model.hidden_size}, '
           f'{cfg.model.num_heads} heads, FFN {cfg.model.ffn_size}, vocab '
           f'{cfg.model.vocab_size}, batch {cfg.train.batch_size} x {cfg.data.seq_len}, '
           f'attention {cfg.model.attention_impl} (block {cfg.model.block_size})')
  table = common.markdown_table(
      ['encoding', 'params', 'step (ms)', '+-', 'ratio vs rope', 'CPU-time ratio', 'target'],
      rows)
  common.report(f'Training-step cost of each encoding ({shape})', table,
                [f'rope step median {common.fmt_ms(base)} ms; ratios are medians of per-round '
                 f'ratios over {args.repeats} interleaved rounds (wall time; CPU time = user + '
                 'system of all threads, robust to machine load)'],
                out=args.out, data=data)


if __name__ == '__main__':
  main()
