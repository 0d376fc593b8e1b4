"""Training step time, tokens/s and MFU of the 151M preset on this host's GPU, per attention impl.

  python benchmarks/gpu_step.py                         # 151M bipe_alibi and rope, bf16
  python benchmarks/gpu_step.py --encodings=bipe_alibi --impls=blockwise,pallas_gpu
  python benchmarks/gpu_step.py --smoke                 # tiny sizes, any platform (a CI check)

Each (encoding, attention impl) pair builds the real training step (the one train/main.py runs:
bipe_jax.training.train_step, AdamW, float32 parameters, `--dtype` compute), warms it up, then
times `--repeats` steps on random tokens, the pairs interleaved so that a disturbance hits all
alike. MFU is the model FLOPs (bipe_jax.training.flops) over the device's published bf16 peak.
An impl that does not run a scheme (cuDNN with a bias, ...) is reported as skipped with the reason.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from benchmarks import common  # pylint: disable=wrong-import-position
from bipe_jax import config as config_lib  # pylint: disable=wrong-import-position
from bipe_jax import model as model_lib  # pylint: disable=wrong-import-position
from bipe_jax import storage  # pylint: disable=wrong-import-position
from bipe_jax.training import flops  # pylint: disable=wrong-import-position
from bipe_jax.state import mesh as mesh_lib  # pylint: disable=wrong-import-position
from bipe_jax.state import optimizer  # pylint: disable=wrong-import-position
from bipe_jax.state import train_state  # pylint: disable=wrong-import-position
from bipe_jax.training import train_step  # pylint: disable=wrong-import-position
from configs import paper_151m  # pylint: disable=wrong-import-position
from configs import tiny  # pylint: disable=wrong-import-position


def build_step(encoding: str, impl: str, args):
  """(step_fn, state, tokens, flops per step) of one (encoding, impl); ValueError if the impl
  cannot run the encoding."""
  config = tiny.get_config() if args.smoke else paper_151m.get_config(encoding)
  with config.unlocked():
    config.model.position_encoding = encoding
    config.model.attention_impl = impl
    config.model.dtype = args.dtype
    config.model.kernels = 'portable'
    config.model.separators = 'ids'
    config.model.separator_ids = (13,)
    config.model.train_length = args.seq_len
    config.model.rope_original_length = args.seq_len
    config.model.max_position = max(int(config.model.max_position), args.seq_len)
    config.model.max_intra = max(int(config.model.max_intra), args.seq_len)
    config.model.block_size = args.block_size
    config.train.batch_size = args.batch_size
    if args.smoke:  # the smallest model that still runs every part of the step
      config.model.num_layers, config.model.hidden_size, config.model.ffn_size = 1, 64, 128
  model_config = config_lib.model_config_from_dict(config.model)
  devices = jax.devices()[:1]
  mesh = mesh_lib.make_mesh(config.mesh, devices)
  model = model_lib.Transformer(model_config)
  tx = optimizer.make_optimizer(config.train)
  schedule = optimizer.learning_rate_schedule(config.train)
  state, shardings = train_state.create_train_state(model, tx, mesh, args.seq_len, seed=0)
  with train_state.mesh_context(mesh):
    step = train_step.make_train_step(model, tx, schedule, mesh, shardings,
                                      loss_chunk_tokens=int(config.train.loss_chunk_tokens))
  rng = np.random.default_rng(0)
  tokens = jax.device_put(jnp.asarray(rng.integers(3, model_config.vocab_size,
                                                   (args.batch_size, args.seq_len)), jnp.int32),
                          mesh_lib.batch_sharding(mesh))
  step_flops = flops.train_flops_per_token(model_config, args.seq_len) * tokens.size
  return step, state, {'tokens': tokens}, step_flops, mesh


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--encodings', default='bipe_alibi,rope')
  parser.add_argument('--impls', default='blockwise,pallas_gpu,cudnn,dense')
  parser.add_argument('--dtype', default='bfloat16')
  parser.add_argument('--batch_size', type=int, default=8)
  parser.add_argument('--seq_len', type=int, default=1024)
  parser.add_argument('--block_size', type=int, default=128)
  parser.add_argument('--repeats', type=int, default=10)
  parser.add_argument('--smoke', action='store_true',
                      help='the tiny preset at 1 layer of width 64, 2 x 64 tokens, 1 repeat (checks '
                      'the script runs)')
  parser.add_argument('--out', default='', help='write the figures as JSON here')
  args = parser.parse_args(argv)
  if args.smoke:
    args.batch_size, args.seq_len, args.repeats, args.block_size = 2, 64, 1, 32
    args.impls = args.impls.replace('cudnn', '') if jax.default_backend() != 'gpu' else args.impls
  device = jax.devices()[0]
  peak, peak_note = flops.peak_flops_per_device(device.device_kind, device.platform, args.dtype)
  rows, results = [], []
  runs = {}
  for encoding in [e for e in args.encodings.split(',') if e]:
    for impl in [i for i in args.impls.split(',') if i]:
      start = time.perf_counter()
      try:
        step, state, batch, step_flops, mesh = build_step(encoding, impl, args)
        with train_state.mesh_context(mesh):
          state, _ = step(state, batch)  # compile
          jax.block_until_ready(state)
      except ValueError as e:
        rows.append([encoding, impl, 'skipped: ' + str(e).split(';')[0][:70], '', ''])
        print(f'{encoding} {impl}: skipped ({str(e).split(";")[0][:70]})', file=sys.stderr)
        continue
      print(f'{encoding} {impl}: built and compiled in {time.perf_counter() - start:.1f} s',
            file=sys.stderr, flush=True)
      runs[(encoding, impl)] = [step, state, batch, step_flops, mesh]
  times = {key: [] for key in runs}
  for _ in range(args.repeats):  # interleaved: one step of each pair per round
    for key, run in runs.items():
      step, state, batch, _, mesh = run
      with train_state.mesh_context(mesh):
        start = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
      times[key].append(time.perf_counter() - start)
      run[1] = state
  for (encoding, impl), run in runs.items():
    seconds = common.median(times[(encoding, impl)])
    tokens_per_s = args.batch_size * args.seq_len / seconds
    mfu = flops.mfu(tokens_per_s, run[3] / (args.batch_size * args.seq_len), peak)
    rows.append([encoding, impl, f'{seconds * 1e3:.1f} ms', f'{tokens_per_s:,.0f}',
                 f'{100 * mfu:.1f} %' if peak else '-'])
    results.append({'encoding': encoding, 'impl': impl, 'step_seconds': seconds,
                    'tokens_per_second': tokens_per_s, 'mfu': mfu})
  title = (f'{"tiny" if args.smoke else "151M"} training step on {device.device_kind} '
           f'({device.platform}), batch {args.batch_size} x {args.seq_len}, {args.dtype}')
  print(title)
  print(common.markdown_table(['encoding', 'attention_impl', 'step (median)', 'tokens/s', 'MFU'],
                              rows))
  print(f'MFU against {peak_note}; median of {args.repeats} interleaved steps after one warm-up')
  if args.out:
    storage.write_json(args.out, {'title': title, 'results': results,
                                  'machine': common.machine_info()}, indent=1)
  return 0 if results else 1


if __name__ == '__main__':
  sys.exit(main())
