"""Compile time and step time of scanned vs unrolled decoder layers (`model.scan_layers`).

Run:  .venv/bin/python benchmarks/scan_layers.py [--depths 12,24] [--encoding rope]
      [--cpu_devices 2] [--out benchmarks/results/scan_layers]

For each depth, the tiny preset's width (128, 4 heads, FFN 512, batch 32 x 128) is built with
unrolled layers and with one `nn.scan` over them; the compile time is the wall time of building
and running the first training step (tracing, XLA compilation, first execution), the step
time the median of interleaved steps afterwards. Scanning compiles one layer body whatever the
depth; it may cost step time (the loop, and the stacked parameters' dynamic slices).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top
from benchmarks import jax_step  # pylint: disable=g-import-not-at-top


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--depths', default='12,24')
  p.add_argument('--encoding', default='rope')
  p.add_argument('--preset', default='tiny', help="the width's preset (jax_step: 'smoke' is the "
                 'smallest)')
  p.add_argument('--cpu_devices', type=int, default=2)
  p.add_argument('--warmup', type=int, default=1)
  p.add_argument('--repeats', type=int, default=5)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  devices = jax_step.use_cpu_devices(args.cpu_devices)
  steps, compile_s = {}, {}
  for depth in [int(d) for d in args.depths.split(',')]:
    for scanned in (False, True):
      name = f'{depth} layers, {"scanned" if scanned else "unrolled"}'
      start = time.perf_counter()
      steps[name] = jax_step.make_project_step(
          args.preset, {'model.num_layers': depth, 'model.scan_layers': scanned,
                   'model.position_encoding': args.encoding}, devices=devices)
      compile_s[name] = time.perf_counter() - start
      print(f'built {name} in {compile_s[name]:.1f} s', file=sys.stderr, flush=True)
  times = common.interleaved({n: s.step for n, s in steps.items()}, warmup=args.warmup,
                             repeats=args.repeats)
  rows, data = [], []
  for name, ts in times.items():
    depth = name.split()[0]
    unrolled = f'{depth} layers, unrolled'
    rows.append([name, f'{compile_s[name]:.1f}', f'{compile_s[name] / compile_s[unrolled]:.2f}',
                 common.fmt_ms(common.median(ts)),
                 f'{common.paired_ratio(times, name, unrolled):.3f}'])
    data.append({'name': name, 'compile_seconds': compile_s[name], 'times': ts})
  table = common.markdown_table(
      ['model', 'compile + first step (s)', 'vs unrolled', 'step (ms)', 'step vs unrolled'],
      rows)
  common.report(f'Scanned vs unrolled layers ({args.encoding}, {args.preset} width)', table,
                [f'{args.repeats} interleaved rounds; data-parallel over {devices} CPU '
                 'device(s)'], out=args.out, data=data)


if __name__ == '__main__':
  main()
