"""Compiles a context-parallel training step for a TPU slice ahead of time; prints per-chip memory.

    JAX_PLATFORMS=cpu nice -n 10 python -m benchmarks.context_parallel_compile \
        --preset bipe_alibi_151m --seq_len 131072 --topology v5e:4x4 --context 16

The preset's config gets `model.scan_layers`, `model.remat`, the given sequence length, block
size and dtype, and the mesh (data, fsdp, context, tensor) = (1, 1, context, 1) over the
topology's devices (no TPU needed: jax.experimental.topologies with the libtpu wheel). The step
is trainer.py's (`train_step.make_train_step`, state shardings from `train_state`), lowered
with abstract arguments and compiled by the TPU compiler; `memory_analysis` gives the exact
per-chip bytes. One JSON line per run is appended to --out.
"""

import argparse
import importlib
import json
import os
import time

import jax
import jax.numpy as jnp
from jax.experimental import topologies

from bipe_jax import model as model_lib
from bipe_jax import storage
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.training import resolve
from bipe_jax.training import setup as setup_lib

GIB = 1024 ** 3
# libtpu locks /tmp/libtpu_lockfile for the chips it would own; compiling owns none, and other
# compiles on the same host must not be refused.
os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')


def compile_step(args) -> dict:
  config = importlib.import_module(f'configs.{args.preset}').get_config()
  m = config.model
  m.scan_layers, m.remat, m.dtype = True, 'full', args.dtype
  m.block_size, m.attention_impl = args.block_size, args.attention_impl
  m.separators, m.separator_ids = 'ids', (13,)  # any id: positions are computed in the step
  config.data.seq_len = args.seq_len
  config.train.batch_size = args.batch
  config.train.grad_accum_steps, config.train.loss_chunk_tokens = 1, 0  # the plain logits
  config.mesh.data, config.mesh.fsdp, config.mesh.context, config.mesh.tensor = (
      -1, 1, args.context, 1)
  devices = topologies.get_topology_desc(platform='tpu', topology_name=args.topology).devices
  resolved = resolve.resolve(config, device_count=len(devices))
  # 'auto' kernels resolve for the mesh: the TPU's portable path
  setup = setup_lib.build(resolved, mesh_lib.make_mesh(resolved.mesh, devices=devices))
  mesh, model = setup.mesh, setup.model
  batch = {'tokens': jax.ShapeDtypeStruct((args.batch, args.seq_len), jnp.int32,
                                          sharding=mesh_lib.batch_sharding(mesh))}
  start = time.time()
  with setup.context():
    compiled = setup.step_fn.lower(setup.target(), batch).compile()
  mem = compiled.memory_analysis()
  total = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
           + mem.temp_size_in_bytes + mem.generated_code_size_in_bytes)
  hlo = compiled.as_text()
  return {
      'preset': args.preset, 'topology': args.topology, 'device_kind': devices[0].device_kind,
      'mesh': dict(mesh.shape), 'seq_len': args.seq_len, 'batch': args.batch,
      'dtype': args.dtype, 'attention_impl': args.attention_impl,
      'block_size': args.block_size, 'params': model_lib.count_params(model.config),
      'argument_gib': mem.argument_size_in_bytes / GIB,
      'output_gib': mem.output_size_in_bytes / GIB, 'alias_gib': mem.alias_size_in_bytes / GIB,
      'temp_gib': mem.temp_size_in_bytes / GIB, 'total_gib_per_chip': total / GIB,
      'all_gathers': hlo.count('all-gather-start(') + hlo.count('all-gather('),
      'compile_seconds': round(time.time() - start, 1)}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--preset', default='bipe_alibi_151m')
  p.add_argument('--seq_len', type=int, default=131072)
  p.add_argument('--topology', default='v5e:4x4')
  p.add_argument('--context', type=int, default=16)
  p.add_argument('--batch', type=int, default=1)
  p.add_argument('--block_size', type=int, default=1024)
  p.add_argument('--attention_impl', default='blockwise')
  p.add_argument('--dtype', default='bfloat16')
  p.add_argument('--out', default='benchmarks/results/context_parallel_compile.jsonl')
  row = compile_step(p.parse_args())
  print(json.dumps(row))
  with storage.open_append(p.parse_args().out) as f:  # a local file or gs://... (in parts)
    f.write(json.dumps(row) + '\n')


if __name__ == '__main__':
  main()
