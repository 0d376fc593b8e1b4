"""Against the limit: model-FLOPs utilisation of the training step on this CPU.

Run:  .venv/bin/python benchmarks/mfu.py [--presets tiny,small] [--encodings rope,bipe_rope]
      [--cpu_devices 2]

Achieved FLOP/s = tokens per step x training FLOPs per token (the code's own formula,
bipe_jax.training.flops.train_flops_per_token) / step time. The limit is the float32
matmul peak measured *in the same rounds* (a jitted 2048x2048 @ 2048x2048 product is one
of the interleaved candidates), so MFU = median over rounds of achieved / peak, which
cancels changes of machine load between rounds. With `--cpu_devices N` (default 2, as
`train/main.py --cpu_devices`) the step is data-parallel over N single-threaded CPU devices and
the peak is N such products run at once, one per device.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top
from benchmarks import jax_step  # pylint: disable=g-import-not-at-top

PEAK = 'matmul 2048^3 float32'
PEAK_N = 2048


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--presets', default='tiny,small')
  p.add_argument('--encodings', default='rope,bipe_rope')
  p.add_argument('--attention_impl', default='', help="'' = the preset's")
  p.add_argument('--cpu_devices', type=int, default=2)
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--repeats', type=int, default=10)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  devices = jax_step.use_cpu_devices(args.cpu_devices)
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  mesh = jax.sharding.Mesh(jax.devices()[:devices], ('d',))
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('d'))
  a = jax.device_put(jax.random.normal(jax.random.PRNGKey(0), (devices, PEAK_N, PEAK_N),
                                       jnp.float32), spec)
  mm = jax.jit(lambda x: jnp.einsum('dij,djk->dik', x, x), out_shardings=spec)
  fns = {PEAK: lambda: mm(a)}
  steps = {}
  for preset in args.presets.split(','):
    for enc in args.encodings.split(','):
      ov = {'model.position_encoding': enc}
      if args.attention_impl:
        ov['model.attention_impl'] = args.attention_impl
      s = jax_step.make_project_step(preset, ov, devices=devices)
      s.step()
      key = f'{preset} / {enc}'
      steps[key] = s
      fns[key] = s.step
  times = common.interleaved(fns, warmup=args.warmup, repeats=args.repeats)
  peak_flops = 2.0 * PEAK_N ** 3 * devices
  peak = peak_flops / common.median(times[PEAK])
  rows, data = [], []
  for key, s in steps.items():
    step_flops = s.tokens_per_step * s.train_flops_per_token
    per_round = [(step_flops / t) / (peak_flops / tp) for t, tp in zip(times[key], times[PEAK])]
    t = common.median(times[key])
    achieved = step_flops / t
    m = common.median(per_round)
    cfg = s.config
    rows.append([key, f'{s.num_params / 1e6:.2f}M',
                 f'{cfg.train.batch_size}x{cfg.data.seq_len}',
                 f'{s.train_flops_per_token / 1e6:.2f}', common.fmt_ms(t),
                 f'{s.tokens_per_step / t:,.0f}', f'{achieved / 1e9:.1f}', f'{m * 100:.1f}%'])
    data.append({'name': key, 'times': times[key], 'flops_per_token': s.train_flops_per_token,
                 'tokens_per_step': s.tokens_per_step, 'mfu': m})
  table = common.markdown_table(
      ['preset / encoding', 'params', 'batch', 'train MFLOP/token', 'step (ms)', 'tokens/s',
       'achieved GFLOP/s', 'MFU'], rows)
  common.report('Model-FLOPs utilisation of the training step', table,
                [f'float32 matmul peak in the same rounds: {peak / 1e9:.0f} GFLOP/s '
                 f'({PEAK_N}^3 on each of {devices} device(s), median); MFU = median of '
                 'per-round achieved / peak',
                 f'steps data-parallel over {devices} single-threaded CPU device(s)'],
                out=args.out, data={'peak_flops_per_s': peak, 'rows': data})


if __name__ == '__main__':
  main()
