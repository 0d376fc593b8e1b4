"""Long-context TRAINING memory: one real training step at 2k-16k tokens, CPU and TPU compile.

Run:  nice -n 10 .venv/bin/python benchmarks/long_context_training_memory.py \
          --target cpu --out benchmarks/results/long_context_training_memory_cpu
      nice -n 10 .venv/bin/python benchmarks/long_context_training_memory.py \
          --target tpu --out benchmarks/results/long_context_training_memory_tpu
      (--lengths 2048,4096,8192,16384 --encodings rope,alibi,bipe_alibi,kerple,t5,dape_kerple
       --layers 2 --block_size 512 --label after)

The step is the project's own (`bipe_jax.training.train_step.make_train_step`: model, chunked
next-token loss, gradients, AdamW update), for the tiny preset's width (128, 4 heads) with
`--layers` layers, attention_impl='blockwise' (the long-context path of every encoding, the
RoPE family included), one row per device.

Each (encoding, length) point on CPU is a fresh subprocess (`--child`), each encoding on TPU:
  cpu  the step compiled for this host's CPU and run once on random tokens: XLA's compiled
       temporaries (`memory_analysis().temp_size_in_bytes`) and the process's peak RSS.
  tpu  the same step compiled ahead of time for a TPU v5e 2x2 topology
       (jax.experimental.topologies; data-parallel over the 4 chips, batch 1 per chip): the
       per-chip temporaries of the compiled program. Nothing runs.
The last column is the 16k / 4k ratio of the temporaries (linear: 4, quadratic: 16).

To measure the code before a change, run this file from a copy of the older tree (it imports
bipe_jax from the repository it sits in): `git archive <commit> | tar -x -C /tmp/before`,
copy this file into /tmp/before/benchmarks/, run it there with `--label before`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top

TPU_TOPOLOGY = 'v5e:2x2'


def _step_and_inputs(encoding: str, length: int, layers: int, block_size: int, devices):
  """(jitted step, abstract state, token spec, mesh, model) for one row per device."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from benchmarks import jax_step  # pylint: disable=g-import-not-at-top
  from bipe_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import optimizer as opt_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import train_state as state_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import train_step as step_lib  # pylint: disable=g-import-not-at-top

  config = jax_step.load_config('tiny', {
      'model.position_encoding': encoding, 'model.attention_impl': 'blockwise',
      'model.block_size': block_size, 'model.num_layers': layers,
      'data.seq_len': length, 'train.batch_size': len(devices)})
  config.mesh.data = len(devices)
  mc = config_lib.model_config_from_dict(config.model)
  model = model_lib.Transformer(mc)
  tx = opt_lib.make_optimizer(config.train)
  schedule = opt_lib.learning_rate_schedule(config.train)
  mesh = mesh_lib.make_mesh(config.mesh, devices=devices)
  abstract, shardings = state_lib.state_shardings(model, tx, mesh, length)
  with state_lib.mesh_context(mesh):
    jitted = step_lib.make_train_step(model, tx, schedule, mesh, shardings, pad_id=mc.pad_id,
                                      loss_chunk_tokens=config.train.loss_chunk_tokens)
  tokens = jax.ShapeDtypeStruct((len(devices), length), jnp.int32,
                                sharding=mesh_lib.batch_sharding(mesh))
  return (jitted, state_lib.abstract_with_shardings(abstract, shardings), tokens, mesh, model,
          tx)


def child(target: str, encoding: str, length: int, layers: int, block_size: int) -> dict:
  """Runs in the subprocess: compiles (and on CPU runs) one step; returns its memory."""
  import jax  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import train_state as state_lib  # pylint: disable=g-import-not-at-top

  if target == 'tpu':
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
    devices = topologies.get_topology_desc(platform='tpu', topology_name=TPU_TOPOLOGY).devices
  else:
    devices = jax.devices()[:1]
  jitted, state_spec, tokens_spec, mesh, model, tx = _step_and_inputs(
      encoding, length, layers, block_size, devices)
  with state_lib.mesh_context(mesh):
    compiled = jitted.lower(state_spec, {'tokens': tokens_spec}).compile()
  mem = compiled.memory_analysis()
  result = {'temp_bytes': int(mem.temp_size_in_bytes),
            'argument_bytes': int(mem.argument_size_in_bytes)}
  if target == 'cpu':
    import numpy as np  # pylint: disable=g-import-not-at-top
    state, _ = state_lib.create_train_state(model, tx, mesh, length, seed=0)
    rng = np.random.default_rng(0)
    tokens = jax.device_put(rng.integers(0, 4096, size=(1, length), dtype=np.int32),
                            tokens_spec.sharding)
    result['setup_rss'] = common.current_rss_bytes()
    _, metrics = compiled(state, {'tokens': tokens})
    result['loss'] = float(metrics['loss'])
    result['peak_rss'] = common.peak_rss_bytes()
  return result


def _table(results, target):
  mib = lambda x: f'{x / 2 ** 20:.1f}'
  by_key = {(r['label'], r['encoding'], r['length']): r for r in results}
  rows = []
  for r in results:
    if 'temp_bytes' not in r:
      rows.append([r['label'], r['encoding'], r['length'], r.get('error', '?')]
                  + [''] * (3 if target == 'cpu' else 1))
      continue
    ratio = ''
    if r['length'] == 16384:
      base = by_key.get((r['label'], r['encoding'], 4096), {})
      if 'temp_bytes' in base:
        ratio = f'{r["temp_bytes"] / base["temp_bytes"]:.2f}x temp'
        if target == 'cpu':
          ratio += f', {r["peak_rss"] / base["peak_rss"]:.2f}x peak RSS'
    rss = [mib(r['setup_rss']), mib(r['peak_rss'])] if target == 'cpu' else []
    rows.append([r['label'], r['encoding'], r['length'], mib(r['temp_bytes'])] + rss + [ratio])
  if target == 'tpu':
    headers = ['XLA temporaries per chip (MiB)']
  else:
    headers = ['XLA temporaries (MiB)', 'RSS before the step (MiB)', 'peak RSS (MiB)']
  return common.markdown_table(['code', 'encoding', 'tokens'] + headers + ['16k / 4k'], rows)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--target', choices=('cpu', 'tpu'), default='cpu')
  p.add_argument('--lengths', default='2048,4096,8192,16384')
  p.add_argument('--encodings', default='rope,alibi,bipe_alibi,kerple,t5,dape_kerple')
  p.add_argument('--layers', type=int, default=2)
  p.add_argument('--block_size', type=int, default=512)
  p.add_argument('--label', default='after', help='names the code measured (before / after)')
  p.add_argument('--timeout', type=float, default=3600)
  p.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
  p.add_argument('--out', default=None, help='path prefix: writes <out>.md and <out>.json')
  p.add_argument('--combine', default=None,
                 help='comma-separated .json results of earlier runs (e.g. before and after): '
                      'writes their points as one table instead of measuring')
  args = p.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(',')]
  if args.combine:
    _write(combine_results(args.combine.split(',')), args)
    return
  if args.child:
    print(json.dumps({'points': [child(args.target, args.encodings, t, args.layers,
                                       args.block_size) for t in lengths]}), flush=True)
    return
  # libtpu's lockfile would refuse a second process compiling for TPU on this host
  env = {'JAX_PLATFORMS': 'cpu', 'ALLOW_MULTIPLE_LIBTPU_LOAD': '1'}
  results = []
  # CPU: one process per point (its own peak RSS); TPU: one per encoding (libtpu starts once).
  groups = [[t] for t in lengths] if args.target == 'cpu' else [lengths]
  for enc in args.encodings.split(','):
    for group in groups:
      got = common.run_json_subprocess(
          [os.path.abspath(__file__), '--child', '--target', args.target, '--encodings', enc,
           '--lengths', ','.join(map(str, group)), '--layers', str(args.layers),
           '--block_size', str(args.block_size)], env=env, timeout=args.timeout)
      for t, res in zip(group, got.get('points', [got] * len(group))):
        res = {**res, 'label': args.label, 'encoding': enc, 'length': t}
        results.append(res)
        print(json.dumps(res), file=sys.stderr, flush=True)
  _write(results, args)


def combine_results(paths) -> list:
  """The points of several result files, in order; a failed point is dropped when another
  file has the same (code, encoding, length) measured."""
  points = []
  from bipe_jax import storage  # pylint: disable=g-import-not-at-top
  for path in paths:
    points += json.loads(storage.read_bytes(path))['data']
  key = lambda r: (r['label'], r['encoding'], r['length'])
  measured = {key(r) for r in points if 'temp_bytes' in r}
  kept = [r for r in points if 'temp_bytes' in r or key(r) not in measured]
  return sorted(kept, key=lambda r: (r['label'] != 'before', key(r)[1:]))


def _write(results, args) -> None:
  where = (f'compiled for TPU {TPU_TOPOLOGY} (4 chips, batch 1 per chip)' if args.target == 'tpu'
           else 'compiled and run on this CPU host (batch 1)')
  title = (f'Long-context training step memory, {where}: tiny width, {args.layers} layers, '
           f'blockwise attention (block {args.block_size}), code: '
           + ' and '.join(dict.fromkeys(r['label'] for r in results)))
  text = '\n'.join([f'### {title}', '', f'Measured {common.machine_line()}.', '',
                    _table(results, args.target), ''])
  print(text, flush=True)
  if args.out:  # memory figures do not depend on the machine's load: always written
    common.write_results(args.out, text, {'machine': common.machine_info(), 'data': results})


if __name__ == '__main__':
  main()
