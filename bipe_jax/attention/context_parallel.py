"""Context parallelism: the sequence axis sharded over the `context` mesh axis.

With `mesh.context = C > 1` every activation [B, T, ...] holds T / C consecutive tokens per
device (the logical-axis rule `length` -> `context`, state/mesh.py). Two computations need
more than their own tokens, and both run inside `jax.shard_map` here:

Positions (`global_positions`). Bilevel streams are prefix counts over the whole row: a shard's
segment index needs the separators of every shard before it, its first intra offsets the last
separator before it (possibly several shards back), its document ids the document starts before
it. Each shard summarises its tokens in a `positions.PositionCarry` (10 int32 per row), the
summaries are all-gathered over `context` ([C, B, 10] integers, never the tokens), each shard
folds those of the shards before it into its carry, and computes its streams with
`positions.bilevel_positions(..., carry=...)`: exactly the streams of the full row.

Attention (`gathered_kv_attention`). Each shard keeps its T / C queries and all-gathers the keys,
values and key-side position slices (causal index, bias stream, validity, document id) of the
whole row, then runs the configured attention (`dense`, `blockwise`, `fused`) on [T / C, T]:
biases and masks come from the global position slices, so every encoding (RoPE on any stream,
ALiBi / Kerple / FIRE / T5 on any stream, DAPE with its halo) is computed as without sharding.
Why all-gather rather than a ring: see docs/design.md ("Context parallelism").
"""

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from bipe_jax.attention import core as attention_lib
from bipe_jax import positions as positions_lib

CONTEXT_AXIS = 'context'
_ROW_AXES = ('data', 'fsdp')  # the batch axes (state/mesh.py BATCH_AXES)
_HEAD_AXIS = 'tensor'

# Keyword arguments of the attention functions (core.py) by the axis that holds their
# sequence: query-side ones stay local, key-side ones are gathered over the context axis; the
# mask (an AttentionMask) holds both sides.
_QUERY_SIDE = ('q_streams',)
_KEY_SIDE = ('k_streams',)
_MASK = 'mask'
_KEY_BIAS = 'key_bias_BxHx1xK'  # [B, H, 1, K]: keys on axis 3


def _mesh():
  mesh = jax.sharding.get_abstract_mesh()
  return None if mesh.empty else mesh


def context_size() -> int:
  """Size of the current mesh's context axis (1 without a mesh or without that axis)."""
  mesh = _mesh()
  if mesh is None or CONTEXT_AXIS not in mesh.axis_names:
    return 1
  return int(mesh.shape[CONTEXT_AXIS])


def active(length: int) -> bool:
  """True when a sequence of `length` tokens is split over a context axis (size > 1 dividing
  it). Otherwise the model runs its ordinary path (still correct under any sharding)."""
  c = context_size()
  return c > 1 and length % c == 0


def _axes_dividing(mesh, names, *sizes) -> Optional[tuple]:
  """The mesh axes of `names` present in `mesh`, if their product divides every size; else
  None (that dimension is then replicated inside the shard_map)."""
  present = tuple(n for n in names if n in mesh.axis_names)
  if not present:
    return None
  total = int(np.prod([mesh.shape[n] for n in present]))
  return present if all(s % total == 0 for s in sizes) else None


def global_positions(tokens_BxT: jax.Array, separator_table_V, *, document_start_table_V=None,
                     pad_id: Optional[int] = None, restart_at_documents: bool = False,
                     valid_BxT: Optional[jax.Array] = None, paragraph_table_V=None,
                     fixed_segment_length: int = 0) -> positions_lib.BilevelPositions:
  """`positions.bilevel_positions` of rows whose T axis is sharded over the context axis.

  Same arguments and result (every stream [B, T], sharded like the tokens); call it under a
  mesh where `active(T)` holds.
  """
  mesh = _mesh()
  b = tokens_BxT.shape[0]
  spec = P(_axes_dividing(mesh, _ROW_AXES, b), CONTEXT_AXIS)
  tables = dict(document_start_table_V=document_start_table_V, pad_id=pad_id,
                paragraph_table_V=paragraph_table_V)

  def local(tokens_bxt, valid_bxt):
    summary = positions_lib.chunk_carry(tokens_bxt, separator_table_V, valid_BxT=valid_bxt,
                                        **tables)
    every = jax.lax.all_gather(summary, CONTEXT_AXIS)  # fields [C, b]
    shards = jax.tree.leaves(every)[0].shape[0]
    before = [positions_lib.PositionCarry.empty(tokens_bxt.shape[0])]
    for i in range(shards - 1):
      before.append(positions_lib.combine_carries(before[-1],
                                                  jax.tree.map(lambda x, i=i: x[i], every)))
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *before)
    carry = jax.tree.map(lambda x: x[jax.lax.axis_index(CONTEXT_AXIS)], stacked)
    return positions_lib.bilevel_positions(
        tokens_bxt, separator_table_V, restart_at_documents=restart_at_documents,
        valid_BxT=valid_bxt, carry=carry, fixed_segment_length=fixed_segment_length, **tables)

  if valid_BxT is None:
    fn = jax.shard_map(lambda t: local(t, None), in_specs=spec, out_specs=spec)
    return fn(tokens_BxT)
  fn = jax.shard_map(local, in_specs=(spec, spec), out_specs=spec)
  return fn(tokens_BxT, jnp.asarray(valid_BxT, bool))


def gathered_kv_attention(attend: Callable[..., jax.Array], q_BxHxTxDh: jax.Array,
                          k_BxGxTxDh: jax.Array, v_BxGxTxDh: jax.Array,
                          **kwargs: Any) -> jax.Array:
  """`attend(q, k, v, **kwargs)` (a core.py function) with T sharded over the context
  axis: each shard attends its own queries to the all-gathered keys and values.

  `mask` (AttentionMask, arrays [B, T]) and the streams named in `_QUERY_SIDE` / `_KEY_SIDE`
  ([B, T, ...], any pytree) are position slices: their key side is gathered, their query side
  stays local; `key_bias_BxHx1xK` is gathered on its key axis; callables and static values pass
  through (parameters they close over are replicated). Returns [B, H, T, Dh], sharded like q.
  """
  mesh = _mesh()
  b, h = q_BxHxTxDh.shape[:2]
  g = k_BxGxTxDh.shape[1]
  rows = _axes_dividing(mesh, _ROW_AXES, b)
  heads = _axes_dividing(mesh, (_HEAD_AXIS,), h, g)
  arrays = {n: x for n, x in kwargs.items()
            if n in _QUERY_SIDE + _KEY_SIDE + (_MASK, _KEY_BIAS) and x is not None}
  static = {n: x for n, x in kwargs.items() if n not in arrays}
  for n in ('batch_axes', 'head_axes'):  # the Pallas kernels' own per-device mapping: this
    if n in static:                      # shard_map already runs per device
      static[n] = None
  tokens_spec = P(rows, CONTEXT_AXIS)
  head_spec = P(rows, heads, CONTEXT_AXIS, None)
  specs = {n: (P(rows, heads, None, CONTEXT_AXIS) if n == _KEY_BIAS else
               jax.tree.map(lambda _: tokens_spec, x)) for n, x in arrays.items()}

  def local(q, k, v, arrays):
    gather = lambda x, axis: jax.lax.all_gather(x, CONTEXT_AXIS, axis=axis, tiled=True)
    gathered = {}
    for n, x in arrays.items():
      if n == _KEY_BIAS:
        gathered[n] = gather(x, 3)
      elif n == _MASK:
        gathered[n] = x.map_keys(lambda y: gather(y, 1))
      elif n in _KEY_SIDE:
        gathered[n] = jax.tree.map(lambda y: gather(y, 1), x)
      else:
        gathered[n] = x
    return attend(q, gather(k, 2), gather(v, 2), **gathered, **static)

  # check_vma=False: the blockwise loops start their carries from replicated zeros and update
  # them with per-shard values (which the vma check rejects in lax.cond / lax.scan). Without
  # the check, the transpose sums the cotangents of replicated inputs (parameters closed over
  # by bias_fn / transform_fn) over the mesh, so their gradients stay exact.
  fn = jax.shard_map(local, in_specs=(head_spec, head_spec, head_spec, specs),
                     out_specs=head_spec, check_vma=False)
  return fn(q_BxHxTxDh, k_BxGxTxDh, v_BxGxTxDh, arrays)


def global_cumsum(x_BxTxN: jax.Array) -> jax.Array:
  """The inclusive prefix sum along T (float32) of an array [B, T, N] whose T axis is sharded
  over the context axis: each shard sums its own slice, the shard totals [C, B, N] are
  all-gathered, and each shard adds the totals of the shards before it (FoX's cumulative log
  forget gates: a carry like the bilevel positions'). Call under a mesh where `active(T)`."""
  mesh = _mesh()
  b = x_BxTxN.shape[0]
  spec = P(_axes_dividing(mesh, _ROW_AXES, b), CONTEXT_AXIS, None)

  def local(x):
    c = jnp.cumsum(x.astype(jnp.float32), axis=1)
    totals = jax.lax.all_gather(c[:, -1], CONTEXT_AXIS)  # [C, b, N]
    earlier = jnp.arange(totals.shape[0]) < jax.lax.axis_index(CONTEXT_AXIS)
    return c + jnp.sum(jnp.where(earlier[:, None, None], totals, 0.0), axis=0)[:, None, :]

  return jax.shard_map(local, in_specs=spec, out_specs=spec)(x_BxTxN)
