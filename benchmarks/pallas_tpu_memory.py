"""Per-chip memory of a real training step compiled ahead of time for TPU: the Pallas kernel
(model.attention_impl='pallas') beside blockwise attention.

Run (on a CPU host: libtpu compiles for a TPU topology without a TPU; minutes per point):
  ALLOW_MULTIPLE_LIBTPU_LOAD=1 JAX_PLATFORMS=cpu nice -n 10 .venv/bin/python \
      benchmarks/pallas_tpu_memory.py --preset bipe_alibi_151m --lengths 8192,32768 \
      --impls blockwise,pallas --topology v5e:2x2 --per_chip_batch 1 [--remat [POLICY]]
  --kernel_only: compile only the attention (forward + backward) of one layer's shapes.

The step is bipe_jax's own (training/train_step.make_train_step: forward, backward, AdamW
update) on a data-parallel mesh over the topology's chips, with model.scan_layers=true and the
preset's dtype and block size (`--remat POLICY`: model.remat, one of bipe_jax.remat's policies;
a bare `--remat` is 'full', per-layer remat); the batch is `per_chip_batch` rows of `length`
tokens per chip. Smallest run (the smoke test's): `--preset tiny --lengths 128 --impls
blockwise,pallas --topology v5e:1x1`.
Reports XLA's memory_analysis() per chip (arguments, outputs, temporaries) as JSON lines, and
the count of Mosaic kernels in the compiled program (3 per attention: forward, dQ, dK/dV); a
point that does not fit in the chip's memory is reported with XLA's error line.
`ALLOW_MULTIPLE_LIBTPU_LOAD=1` lets this run while another process holds libtpu's lock file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GIB = 2**30


def _devices(topology: str):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  return topologies.get_topology_desc(platform='tpu', topology_name=topology).devices


def _figures(compiled, t0: float) -> dict:
  ma = compiled.memory_analysis()
  return {'argument_gib': ma.argument_size_in_bytes / GIB,
          'output_gib': ma.output_size_in_bytes / GIB,
          'temp_gib': ma.temp_size_in_bytes / GIB,
          'mosaic_kernels': compiled.as_text().count('tpu_custom_call'),
          'compile_s': round(time.time() - t0, 1)}


def compile_train_step(preset: str, impl: str, length: int, topology: str,
                       per_chip_batch: int, remat: str) -> dict:
  """Compiles the preset's training step for `topology`; its per-chip memory figures."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from benchmarks import jax_step  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import resolve  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import setup as setup_lib  # pylint: disable=g-import-not-at-top

  devices = _devices(topology)
  config = jax_step.load_config(preset, {
      'model.attention_impl': impl, 'model.scan_layers': True, 'model.remat': remat,
      'data.seq_len': length,
      'train.batch_size': per_chip_batch * len(devices)})
  resolved = resolve.resolve(config, device_count=len(devices))
  setup = setup_lib.build(resolved, mesh_lib.make_mesh(resolved.mesh, devices=devices))
  batch = {'tokens': jax.ShapeDtypeStruct((resolved.train.batch_size, length), jnp.int32,
                                          sharding=mesh_lib.batch_sharding(setup.mesh))}
  t0 = time.time()
  with setup.context():
    compiled = setup.step_fn.lower(setup.target(), batch).compile()
  return _figures(compiled, t0)


def compile_kernel(impl: str, length: int, topology: str, heads: int = 12, head_dim: int = 64,
                   block: int = 256) -> dict:
  """Compiles one attention's forward + backward (bipe_alibi's bias, bfloat16, batch 1) for one
  chip of `topology`: the kernel alone."""
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bipe_jax import attention  # pylint: disable=g-import-not-at-top
  from bipe_jax.attention import pallas  # pylint: disable=g-import-not-at-top
  from bipe_jax.encodings import alibi  # pylint: disable=g-import-not-at-top

  mesh = jax.sharding.Mesh(np.array(_devices(topology)[:1]), ('x',))
  slopes = alibi.alibi_slopes(heads)
  pos = lambda: jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (1, length))

  def loss(q, k, v, inter):
    if impl == 'pallas':
      out = pallas.pallas_attention(
          q, k, v, mask=attention.AttentionMask.causal_from_positions(pos()), q_streams=inter,
          k_streams=inter, tile_bias=pallas.TileBias('alibi'),
          bias_params_HxP=jnp.asarray(96 * slopes)[:, None], block_q=block, block_k=block)
    else:
      out = attention.blockwise_attention(
          q, k, v, mask=attention.AttentionMask.causal_from_positions(pos()), q_streams=inter,
          k_streams=inter, block_size=block,
          bias_fn=functools.partial(alibi.alibi_bias, slopes_H=slopes, slope_factor=96.0))
    return jnp.sum(out.astype(jnp.float32) ** 2)

  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  qkv = jax.ShapeDtypeStruct((1, heads, length, head_dim), jnp.bfloat16, sharding=sharding)
  inter = jax.ShapeDtypeStruct((1, length), jnp.int32, sharding=sharding)
  t0 = time.time()
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(qkv, qkv, qkv, inter).compile()
  return _figures(compiled, t0)


def main(argv=None) -> int:
  from bipe_jax import remat as remat_lib  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--preset', default='bipe_alibi_151m')
  parser.add_argument('--lengths', default='8192,32768')
  parser.add_argument('--impls', default='blockwise,pallas')
  parser.add_argument('--topology', default='v5e:2x2')
  parser.add_argument('--per_chip_batch', type=int, default=1)
  parser.add_argument('--remat', nargs='?', const='full', default='none',
                      choices=remat_lib.REMAT_POLICIES,
                      help="model.remat: a policy name; a bare --remat is 'full' (per layer)")
  parser.add_argument('--kernel_only', action='store_true')
  args = parser.parse_args(argv)
  for length in (int(n) for n in args.lengths.split(',')):
    for impl in args.impls.split(','):
      try:
        if args.kernel_only:
          row = compile_kernel(impl, length, args.topology)
        else:
          row = compile_train_step(args.preset, impl, length, args.topology,
                                   args.per_chip_batch, args.remat)
      except Exception as e:  # pylint: disable=broad-except (XLA's out-of-memory is a figure)
        row = {'error': str(e).splitlines()[0][:300]}
      row = {'what': 'kernel' if args.kernel_only else args.preset, 'impl': impl,
             'length': length, 'topology': args.topology, 'remat': args.remat, **row}
      print(json.dumps(row), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
