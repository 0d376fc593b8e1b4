"""The named device mesh (data, fsdp, context, tensor) and the logical-axis rules that map onto it.

Parameters and activations are annotated with *logical* axis names in the model (design.md:
`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`, `mlp`, `positions`; activations `batch`,
`length`, `embed`, `heads`). `LOGICAL_AXIS_RULES` maps them onto the four mesh axes:

- `data`: pure data parallelism (parameters replicated);
- `fsdp`: data parallelism that also shards parameters and optimizer state along `embed`;
- `context`: context (sequence) parallelism: the `length` axis of activations and batches
  (bipe_jax/attention/context_parallel.py computes positions and attention across its shards);
- `tensor`: tensor parallelism over heads, MLP width and vocabulary.

The rules are a priority list (flax.linen.partitioning): an array dimension takes the first
rule whose mesh axes are still free, so an activation `[batch, length, embed]` shards `batch`
over (data, fsdp) and leaves `embed` unsharded, while a parameter `[vocab, embed]` shards
over (tensor, fsdp).
"""

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

MESH_AXES = ('data', 'fsdp', 'context', 'tensor')
CONTEXT_AXIS = 'context'
BATCH_AXES = ('data', 'fsdp')

LOGICAL_AXIS_RULES = (
    ('batch', BATCH_AXES),
    ('vocab', 'tensor'),
    ('heads', 'tensor'),
    ('kv_heads', 'tensor'),
    ('mlp', 'tensor'),
    ('embed', 'fsdp'),
    ('length', CONTEXT_AXIS),
    ('head_dim', None),
    ('positions', None),
    ('layers', None),  # the stacked axis of scanned layers (model.scan_layers)
)


def resolve_mesh_shape(sizes: Sequence[int], device_count: int) -> tuple[int, ...]:
  """Fills at most one -1 entry of `sizes` so that the product equals `device_count`.

  Raises ValueError naming the mesh fields when the sizes cannot cover the devices.
  """
  sizes = [int(s) for s in sizes]
  names = ', '.join(f'mesh.{a}={s}' for a, s in zip(MESH_AXES, sizes))
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f'mesh sizes must be positive or -1 (fill); got {names}')
  if sizes.count(-1) > 1:
    raise ValueError(f'at most one mesh axis may be -1 (fill); got {names}')
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if device_count % known:
      raise ValueError(
          f'{names} does not divide the device count {device_count}: the product of the '
          f'fixed axes ({known}) must divide {device_count}')
    sizes[sizes.index(-1)] = device_count // known
  elif known != device_count:
    raise ValueError(
        f'{names} uses {known} devices but {device_count} are available; allowed: '
        f'mesh.data * mesh.fsdp * mesh.context * mesh.tensor = {device_count}, or one axis '
        f'-1 (fill)')
  return tuple(sizes)


def make_mesh(mesh_config, devices=None) -> jax.sharding.Mesh:
  """A `Mesh` with axes (data, fsdp, context, tensor) over `devices` (default: all, all
  processes); a config without `mesh.context` gets context 1.

  Axis types are Auto so sharding constraints inside the model are hints, not asserts.
  """
  devices = jax.devices() if devices is None else list(devices)
  shape = resolve_mesh_shape(mesh_sizes(mesh_config), len(devices))
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)


def mesh_sizes(mesh_config) -> tuple[int, ...]:
  """The configured sizes in MESH_AXES order, of a MeshConfig (bipe_jax/run_config.py) or a
  config.mesh section (mesh.context defaults to 1: a section saved before it existed)."""
  return (mesh_config.data, mesh_config.fsdp, getattr(mesh_config, 'context', 1),
          mesh_config.tensor)


def batch_shards(mesh: jax.sharding.Mesh) -> int:
  """How many ways the batch dimension is split (data * fsdp)."""
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def batch_sharding(mesh: jax.sharding.Mesh, ndim: int = 2) -> NamedSharding:
  """Sharding of a global batch `[B, T, ...]`: rows over (data, fsdp), T over context, the
  rest replicated."""
  if ndim == 1:
    return NamedSharding(mesh, P(BATCH_AXES))
  return NamedSharding(mesh, P(BATCH_AXES, CONTEXT_AXIS, *([None] * (ndim - 2))))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _fit_spec(spec: P, shape: Sequence[int], mesh: jax.sharding.Mesh) -> P:
  """Drops the mesh axes of dimensions they do not divide (those dims are replicated)."""
  out = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    if axes is None:
      out.append(None)
      continue
    group = (axes,) if isinstance(axes, str) else tuple(axes)
    size = int(np.prod([mesh.shape[a] for a in group]))
    out.append(axes if dim % size == 0 else None)
  return P(*out)


def logical_to_shardings(logical_specs: Any, abstract_tree: Any,
                         mesh: jax.sharding.Mesh, rules=LOGICAL_AXIS_RULES) -> Any:
  """NamedShardings for a tree from its logical PartitionSpecs.

  `logical_specs` is a tree of PartitionSpecs of logical names (as from
  `nn.get_partition_spec`), `abstract_tree` the matching tree of shapes. A dimension that the
  chosen mesh axes do not divide is replicated instead of failing (e.g. 4 KV heads on a
  tensor axis of 8).
  """
  mesh_specs = nn.logical_to_mesh(logical_specs, rules)
  return jax.tree.map(
      lambda spec, leaf: NamedSharding(mesh, _fit_spec(spec, leaf.shape, mesh)),
      mesh_specs, abstract_tree, is_leaf=lambda x: isinstance(x, P))


def process_data_shard(mesh: jax.sharding.Mesh, global_batch_size: int) -> tuple[int, int]:
  """(index, count) of the slice of the global batch this process must load.

  Processes whose devices hold the same rows (e.g. a tensor axis spanning hosts) load the same
  slice, so `count` is the number of distinct row ranges, not always `jax.process_count()`.
  Raises ValueError when a process's rows are not one contiguous range.
  """
  index_map = batch_sharding(mesh, 1).devices_indices_map((global_batch_size,))
  ranges = {}
  for device, (rows,) in index_map.items():
    start, stop, _ = rows.indices(global_batch_size)
    lo, hi = ranges.get(device.process_index, (start, stop))
    ranges[device.process_index] = (min(lo, start), max(hi, stop))
  distinct = sorted(set(ranges.values()))
  width = distinct[0][1] - distinct[0][0]
  if any(b - a != width for a, b in distinct) or width * len(distinct) != global_batch_size:
    raise ValueError(f'mesh {dict(mesh.shape)} gives processes uneven or overlapping batch '
                     f'rows {ranges}; choose mesh sizes so each process holds whole data shards')
  return distinct.index(ranges[jax.process_index()]), len(distinct)


def global_batch(local_batch: dict, mesh: jax.sharding.Mesh, global_batch_size: int) -> dict:
  """Assembles the global batch `[global_batch_size, ...]` from this process's rows.

  Every process passes the rows of its slice (see `process_data_shard`); the result is one
  global jax.Array per entry, rows sharded over (data, fsdp), built with
  `jax.make_array_from_process_local_data` (multi-host safe).
  """
  out = {}
  for name, value in local_batch.items():
    value = np.asarray(value)
    sharding = batch_sharding(mesh, value.ndim)
    global_shape = (global_batch_size,) + value.shape[1:]
    out[name] = jax.make_array_from_process_local_data(sharding, value, global_shape)
  return out
