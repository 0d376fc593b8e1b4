"""Runs the kernels once per device under the current mesh (`jax.shard_map`).

XLA cannot partition a Mosaic kernel by itself, so under a mesh (`jax.set_mesh`, as the training
step traces) the attention is mapped over shards: batch rows over `batch_axes`, query and KV
heads over `head_axes` (each only where it divides the dimension; otherwise that dimension is
replicated). Attention never mixes rows or heads across shards (KV head g serves the query
heads of its own shard when G is sharded too), so no collective is needed.
"""

from typing import Callable, Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

Axes = Union[None, str, Sequence[str]]


def _fit(axes: Axes, size: int, mesh) -> Axes:
  """`axes` if their mesh size divides `size` (and they exist in the mesh), else None."""
  if axes is None:
    return None
  group = (axes,) if isinstance(axes, str) else tuple(axes)
  if not group or any(a not in mesh.shape for a in group):
    return None
  return axes if size % int(np.prod([mesh.shape[a] for a in group])) == 0 else None


def per_shard(fn: Callable, arrays: dict, *, num_heads: int, num_kv_heads: int,
              batch_axes: Axes, head_axes: Axes):
  """fn(arrays) -> [B, H, Q, Dh], mapped over the current mesh when there is one.

  `arrays`: a dict of arrays (or pytrees of them: the AttentionMask) whose leading axis is the
  batch; 'q' / 'c_q' / 'c_k' [B, H, ..], 'k' / 'v' [B, G, ..] and 'params' [H, P] are also split
  over heads.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or (batch_axes is None and head_axes is None):
    return fn(arrays)
  batch = _fit(batch_axes, arrays['q'].shape[0], mesh)
  heads = _fit(head_axes, num_heads, mesh)
  if _fit(head_axes, num_kv_heads, mesh) is None:
    heads = None
  specs = {}
  for name, x in arrays.items():
    if name == 'params':
      specs[name] = P(heads, None)
    elif name in ('q', 'k', 'v', 'c_q', 'c_k'):  # c: FoX's positions [B, H, 1, T]
      specs[name] = P(batch, heads, *([None] * (x.ndim - 2)))
    else:
      specs[name] = jax.tree.map(lambda y: P(batch, *([None] * (y.ndim - 1))), x)
  return jax.shard_map(fn, in_specs=(specs,), out_specs=P(batch, heads, None, None),
                       check_vma=False)(arrays)
