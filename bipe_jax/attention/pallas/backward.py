"""The backward Pallas kernels: dQ (with the bias parameters' gradient) and dK / dV.

Both recompute each tile's logits and bias (`forward.tile_logits`) and its probabilities from the
forward's log-sum-exp, p = exp(s - lse), so nothing of size [Tq, Tk] is stored. With
delta = rowsum(dO * O) (computed outside; it and the log-sum-exp are rows [B, H, 1, Tq]):
  dS = p * (dO V^T - delta),  dQ = scale dS K,  dK = scale dS^T Q,  dV = p^T dO,
  d params[h, :] = sum over tiles of `TileBias.param_grads(dS)`.
dQ kernel: grid (B, H, query tiles, key tiles); it also writes each query tile's parameter
  gradient [B, H * n_q_tiles, 1, P] (summed outside).
dK / dV kernel: grid (B, G, key tiles, H / G, query tiles): the query heads of a KV group and
  all query tiles accumulate into one key tile (GQA's sum over the group happens in VMEM).
Both compute only the tiles of their rows' ranges (tile_ranges.py; dQ: each query tile's key
tiles, as the forward; dK / dV: each key tile's query tiles) and clamp the other side's block
indices into them, so a skipped step fetches nothing.
FoX (a bias c_q[i] - c_k[j] of float positions, per query head): the dQ kernel also writes
  d c_q = rowsum(dS) per query tile, the dK / dV kernel d c_k = -colsum(dS) per (key tile, query
  head), accumulated over the query tiles.
Every [.., Dh, T] array (q, k, v, dO and the gradients) is in forward.py's layout, the head
dimension in sublanes; dQ, dK and dV are accumulated as [Dh, tile].
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bipe_jax.attention.pallas import cost
from bipe_jax.attention.pallas import forward as fwd
from bipe_jax.attention.pallas import layout


def _tile_grads(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref, params_ref,
                c_refs, *, tile_bias, scale, causal):
  """(p, dS) float32 [q, k] of one tile."""
  s, vis = fwd.tile_logits(q_ref, k_ref, qi_ref, ki_ref, params_ref, c_refs,
                           tile_bias=tile_bias, scale=scale, causal=causal)
  p = jnp.where(vis, jnp.exp(s - layout.row_to_column(lse_ref[...])), 0.0)
  dp = jax.lax.dot_general(do_ref[...], v_ref[...], fwd._TRANS_A,  # [Dh, q] x [Dh, k]
                           preferred_element_type=jnp.float32)
  return p, p * (dp - layout.row_to_column(delta_ref[...]))


def _dq_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref,
               ki_ref, params_ref, *refs, tile_bias, scale, causal, n_q_tiles, n_k_tiles,
               rows):
  c_refs, refs = fwd.split_float_positions(tile_bias, refs)
  if c_refs is None:
    dq_ref, dparams_ref, dq_scr, dparams_scr = refs
  else:
    dq_ref, dparams_ref, dcq_ref, dq_scr, dparams_scr, dcq_scr = refs
  b, h, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)

  pl.when(j == 0)(lambda: fwd.zero(dq_scr, dparams_scr, *([] if c_refs is None else [dcq_scr])))

  @pl.when(fwd.should_run(lo_ref, hi_ref, rows, b, h, i, j))
  def _compute():
    _, ds = _tile_grads(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref,
                        params_ref, c_refs, tile_bias=tile_bias, scale=scale, causal=causal)
    k = k_ref[...]  # [Dh, k]; dQ^T = K^T dS^T
    dq_scr[...] += jax.lax.dot_general(k, ds.astype(k.dtype), fwd._TRANS_B,
                                       preferred_element_type=jnp.float32) * scale
    dparams_scr[...] += tile_bias.param_grads(
        params_ref[...], *layout.streams(layout.query_columns(qi_ref[...]), ki_ref[...]), ds)
    if c_refs is not None:
      dcq_scr[...] += jnp.sum(ds, axis=1, keepdims=True)

  @pl.when(j == n_k_tiles - 1)
  def _finish():
    dq_ref[...] = dq_scr[...].astype(dq_ref.dtype)
    dparams_ref[...] = dparams_scr[...]
    if c_refs is not None:
      dcq_ref[...] = layout.column_to_row(dcq_scr[...])


def _dkv_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref,
                ki_ref, params_ref, *refs, tile_bias, scale, causal, n_q_tiles, n_k_tiles, group,
                rows):
  c_refs, refs = fwd.split_float_positions(tile_bias, refs)
  if c_refs is None:
    dk_ref, dv_ref, dk_scr, dv_scr = refs
  else:
    dk_ref, dv_ref, dck_ref, dk_scr, dv_scr, dck_scr = refs
  b, j, r, i = pl.program_id(0), pl.program_id(2), pl.program_id(3), pl.program_id(4)
  h = pl.program_id(1) * group + r

  pl.when((r == 0) & (i == 0))(lambda: fwd.zero(dk_scr, dv_scr))
  if c_refs is not None:  # per query head: restarts with every head of the group
    pl.when(i == 0)(lambda: fwd.zero(dck_scr))

  @pl.when(fwd.should_run(lo_ref, hi_ref, rows, b, h, j, i))
  def _compute():
    p, ds = _tile_grads(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref,
                        params_ref, c_refs, tile_bias=tile_bias, scale=scale, causal=causal)
    if c_refs is not None:
      dck_scr[...] -= jnp.sum(ds, axis=0, keepdims=True)
    q, do = q_ref[...], do_ref[...]  # [Dh, q]; dV^T = dO^T P, dK^T = Q^T dS
    dv_scr[...] += jnp.dot(do, p.astype(do.dtype), preferred_element_type=jnp.float32)
    dk_scr[...] += jnp.dot(q, ds.astype(q.dtype), preferred_element_type=jnp.float32) * scale

  @pl.when((r == group - 1) & (i == n_q_tiles - 1))
  def _finish():
    dk_ref[...] = dk_scr[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)

  if c_refs is not None:
    @pl.when(i == n_q_tiles - 1)
    def _finish_c():
      dck_ref[...] = dck_scr[...]


def _call(kernel, grid, in_specs, out_specs, out_shape, scratch, semantics, interpret, args,
          cost_estimate):
  return pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=grid, in_specs=in_specs,
                                             out_specs=out_specs, scratch_shapes=scratch),
      out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
      cost_estimate=cost_estimate,
      interpret=interpret,
  )(*args)


def specs(tile_of, d, r, block_q, block_k, num_params, float_positions):
  """In-specs of the backward kernels' arguments (q, k, v, dO, lse, delta, q_info, k_info,
  params[, c_q, c_k]) given tile_of(*grid, lo_ref, hi_ref) -> (batch, query tile, key tile,
  head), the tiles already clamped into the row's range."""
  qh = pl.BlockSpec((None, None, d, block_q),
                    lambda *a: (tile_of(*a)[0], tile_of(*a)[3], 0, tile_of(*a)[1]))
  kv = pl.BlockSpec((None, None, d, block_k),
                    lambda *a: (tile_of(*a)[0], jax.lax.div(tile_of(*a)[3], r), 0,
                                tile_of(*a)[2]))
  row = pl.BlockSpec((None, None, 1, block_q),
                     lambda *a: (tile_of(*a)[0], tile_of(*a)[3], 0, tile_of(*a)[1]))
  return [qh, kv, kv, qh, row, row,
          *fwd.side_specs(block_q, block_k, num_params, tile_of, float_positions)]


def dq_specs(b, h, g, d, n_q, n_k, block_q, block_k, num_params, float_positions,
             rows: fwd.Rows):
  """(grid, in_specs, out_specs) of the dQ call: grid (B, H, query tiles, key tiles), the key
  side clamped into each query tile's key range (as the forward)."""
  def tile_of(bb, hh, i, j, lo_ref, hi_ref):
    return bb, i, rows.fetch(lo_ref, hi_ref, bb, hh, i, j), hh

  out_specs = ([pl.BlockSpec((None, None, d, block_q), lambda bb, hh, i, j, *_: (bb, hh, 0, i)),
                pl.BlockSpec((None, None, 1, num_params),
                             lambda bb, hh, i, j, *_: (bb, hh * n_q + i, 0, 0))]
               + ([pl.BlockSpec((None, None, 1, block_q),
                                lambda bb, hh, i, j, *_: (bb, hh, 0, i))]
                  if float_positions else []))
  return ((b, h, n_q, n_k),
          specs(tile_of, d, h // g, block_q, block_k, num_params, float_positions), out_specs)


def dkv_specs(b, h, g, d, n_q, n_k, block_q, block_k, num_params, float_positions,
              rows: fwd.Rows):
  """(grid, in_specs, out_specs) of the dK / dV call: grid (B, G, key tiles, H / G, query
  tiles), the query side clamped into each key tile's query range."""
  r = h // g

  def tile_of(bb, gg, j, rr, i, lo_ref, hi_ref):
    return bb, rows.fetch(lo_ref, hi_ref, bb, gg * r + rr, j, i), j, gg * r + rr

  kv_out = pl.BlockSpec((None, None, d, block_k), lambda bb, gg, j, rr, i, *_: (bb, gg, 0, j))
  out_specs = ([kv_out, kv_out]
               + ([pl.BlockSpec((None, None, 1, block_k),
                                lambda bb, gg, j, rr, i, *_: (bb, gg * r + rr, 0, j))]
                  if float_positions else []))
  return ((b, g, n_k, r, n_q),
          specs(tile_of, d, r, block_q, block_k, num_params, float_positions), out_specs)


def backward(q, k, v, out, lse, d_out, params_HxP, q_info, k_info, k_lo, k_hi, q_lo, q_hi,
             c_q=None, c_k=None, *, tile_bias, scale: float, causal: bool, block_q: int,
             block_k: int, per_head: bool, interpret: bool):
  """(dq, dk, dv in the inputs' dtypes, d params float32 [H, P], d c_q, d c_k float32
  [B, H, 1, T] or None); shapes (q [B, H, Dh, Tq], ...) as `forward.forward`; k_lo / k_hi
  (per query tile) and q_lo / q_hi (per key tile): tile_ranges.py's ranges."""
  b, h, d, tq = q.shape
  g, tk = k.shape[1], k.shape[3]
  r = h // g
  n_q, n_k = tq // block_q, tk // block_k
  num_params = params_HxP.shape[-1]
  params = params_HxP.astype(jnp.float32)[:, None, :]
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=2, keepdims=True)
  uses_c = tile_bias.uses_float_positions
  args = (q, k, v, d_out, lse, delta, q_info, k_info, params,
          *fwd.float_position_args(tile_bias, c_q, c_k))
  statics = dict(tile_bias=tile_bias, scale=scale, causal=causal, n_q_tiles=n_q, n_k_tiles=n_k)
  dq_cost, dkv_cost = cost.backward_cost(b, h, g, tq, tk, d, block_q, block_k, causal,
                                         q.dtype.itemsize, num_params, uses_c, k_lo.size)
  shape = (b, h, g, d, n_q, n_k, block_q, block_k, num_params, uses_c)

  c_row = lambda n: jax.ShapeDtypeStruct((b, h, 1, n), jnp.float32)
  q_rows, k_rows = fwd.Rows(n_q, h, per_head), fwd.Rows(n_k, h, per_head)
  grid, in_specs, out_specs = dq_specs(*shape, q_rows)
  dq_outs = _call(
      functools.partial(_dq_kernel, rows=q_rows, **statics), grid, in_specs, out_specs,
      [jax.ShapeDtypeStruct(q.shape, q.dtype),
       jax.ShapeDtypeStruct((b, h * n_q, 1, num_params), jnp.float32)]
      + ([c_row(tq)] if uses_c else []),
      [pltpu.VMEM((d, block_q), jnp.float32), pltpu.VMEM((1, num_params), jnp.float32)]
      + ([pltpu.VMEM((block_q, 1), jnp.float32)] if uses_c else []),
      ('parallel', 'parallel', 'parallel', 'arbitrary'), interpret, (k_lo, k_hi, *args),
      dq_cost)

  grid, in_specs, out_specs = dkv_specs(*shape, k_rows)
  dkv_outs = _call(
      functools.partial(_dkv_kernel, group=r, rows=k_rows, **statics), grid, in_specs,
      out_specs,
      [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
      + ([c_row(tk)] if uses_c else []),
      [pltpu.VMEM((d, block_k), jnp.float32), pltpu.VMEM((d, block_k), jnp.float32)]
      + ([pltpu.VMEM((1, block_k), jnp.float32)] if uses_c else []),
      ('parallel', 'parallel', 'parallel', 'arbitrary', 'arbitrary'), interpret,
      (q_lo, q_hi, *args), dkv_cost)
  dq, dparams = dq_outs[:2]
  dk, dv = dkv_outs[:2]
  d_params = jnp.sum(dparams.reshape(b, h, n_q, num_params), axis=(0, 2))
  d_c = (dq_outs[2], dkv_outs[2]) if uses_c else (None, None)
  return dq, dk, dv, d_params, *d_c
