"""Where the training step's time goes: a jax.profiler trace aggregated per XLA operation.

Run:  .venv/bin/python benchmarks/profile_step.py [--preset tiny --encoding rope
      --attention_impl dense --steps 3 --top 25]

Traces `--steps` steps of the project's training step (benchmarks/jax_step.py) with
`jax.profiler`, sums the duration of every XLA CPU operation (thunk) per step, and
annotates each with its result shape and the JAX operation it came from (the `op_name`
metadata in the compiled HLO: `jvp(...)` = forward, `transpose(jvp(...))` = backward).
Also prints totals per kind of JAX operation (dot_general, transpose, pad, ...).
The machine is shared: read the shares (%), not the absolute milliseconds.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top
from benchmarks import jax_step  # pylint: disable=g-import-not-at-top

_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\S+(?:\{[^}]*\})?)\s+([\w\-]+)\(')
_OPNAME = re.compile(r'op_name="([^"]*)"')


def hlo_index(hlo_text: str) -> dict[str, tuple[str, str, str]]:
  """instruction name -> (result shape, opcode, JAX op_name) from optimised HLO text."""
  out = {}
  for line in hlo_text.splitlines():
    m = _INSTR.match(line)
    if m:
      op = _OPNAME.search(line)
      out[m.group(1)] = (m.group(2), m.group(3), op.group(1) if op else '')
  return out


def trace_op_times(trace_dir: str) -> collections.Counter:
  """Total microseconds per trace event name (complete events) in a profiler trace."""
  files = glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'), recursive=True)
  if not files:
    raise RuntimeError(f'no trace written under {trace_dir}')
  events = json.load(gzip.open(files[0]))['traceEvents']
  total = collections.Counter()
  for e in events:
    if e.get('ph') == 'X' and 'dur' in e:
      total[e['name']] += e['dur']
  return total


def short_op(op_name: str) -> str:
  """'jit(train_step)/transpose(jvp(Transformer))/layer_0/attention/dot_general' ->
  'bwd layer_0/attention/dot_general'."""
  if not op_name:
    return ''
  kind = 'bwd' if 'transpose(' in op_name else ('fwd' if 'jvp(' in op_name else '')
  parts = [p for p in op_name.split('/') if p and not p.startswith(('jit(', 'jvp(',
                                                                     'transpose('))]
  return (kind + ' ' + '/'.join(parts[-4:])).strip()


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--preset', default='tiny')
  p.add_argument('--encoding', default='rope')
  p.add_argument('--attention_impl', default='')
  p.add_argument('--steps', type=int, default=3)
  p.add_argument('--top', type=int, default=25)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  import jax  # pylint: disable=g-import-not-at-top
  ov = {'model.position_encoding': args.encoding}
  if args.attention_impl:
    ov['model.attention_impl'] = args.attention_impl
  s = jax_step.make_project_step(args.preset, ov)
  title = f'{args.encoding}, {s.config.model.attention_impl} attention'
  step_fn, hlo_fn = s.step, s.hlo_text
  for _ in range(2):
    common.block(step_fn())
  index = hlo_index(hlo_fn())
  trace_dir = tempfile.mkdtemp(prefix='bipe_profile_')
  jax.profiler.start_trace(trace_dir)
  for _ in range(args.steps):
    common.block(step_fn())
  jax.profiler.stop_trace()
  times = trace_op_times(trace_dir)
  ops = {n: t / args.steps for n, t in times.items() if n in index}
  total = sum(ops.values())
  rows = []
  for name, t in sorted(ops.items(), key=lambda kv: -kv[1])[:args.top]:
    shape, opcode, op_name = index[name]
    rows.append([name, opcode, shape[:40], short_op(op_name)[:70], f'{t / 1e3:.1f}',
                 f'{100 * t / total:.1f}%'])
  table = common.markdown_table(
      ['XLA op', 'opcode', 'result', 'from (JAX)', 'ms/step', 'share'], rows)
  kinds = collections.Counter()
  for name, t in ops.items():
    op_name = index[name][2]
    last = op_name.rsplit('/', 1)[-1] if op_name else index[name][1]
    phase = 'bwd' if 'transpose(' in op_name else ('fwd' if 'jvp(' in op_name else 'other')
    kinds[f'{phase} {last}'] += t
  kind_table = common.markdown_table(
      ['phase, JAX op', 'ms/step', 'share'],
      [[k, f'{t / 1e3:.1f}', f'{100 * t / total:.1f}%'] for k, t in kinds.most_common(20)])
  common.report(
      f'Profile of the {args.preset} training step ({title})', table + '\n\n' + kind_table,
      [f'sum of XLA op time {total / 1e3:.1f} ms per step over {len(ops)} ops '
       f'(ops run on 2 cores, partly in parallel)'],
      out=args.out, data={'ops': {n: [t, *index[n]] for n, t in ops.items()}})


if __name__ == '__main__':
  main()
