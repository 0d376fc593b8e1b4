"""The fused DAPE V1 backward Pallas kernels: dQ with the parameters' gradients, and dK / dV.

Both recompute each tile of all heads (dape_forward.tile_logits: scores, static bias, DAPE's
MLP, mask) and its probabilities from the forward's log-sum-exp, p_h = exp(A_h - lse_h). With
delta_h = rowsum(dO_h * O_h) (computed outside):
  dA_h = p_h * (dO_h V_g^T - delta_h),  then through the MLP (dape_tile.backward) ds_h, db_h;
  dQ_h = scale ds_h K_g,  dK_g = scale sum_{h in g} ds_h^T Q_h,  dV_g = sum_{h in g} p_h^T dO_h;
  the packed parameters' gradient (DAPE's w_in, b_in, w_out, b_out and the bias parameters
  through tile_bias.param_grad_tiles on db) as sums over the tiles (dape_tile.backward).
dQ kernel: grid (B, query tiles, key tiles), key tiles innermost; it accumulates the parameters'
  gradient as rows [size, bk] (summed over the tile's queries) in VMEM across all tiles of a
  batch row and writes them once per row ([B, size8, bk], summed outside).
dK / dV kernel: grid (B, key tiles, query tiles), query tiles innermost.
Both compute only the tiles of their rows' ranges (tile_ranges.py) and clamp the other side's
block indices into them.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bipe_jax.attention.pallas import dape_cost
from bipe_jax.attention.pallas import dape_forward as fwd
from bipe_jax.attention.pallas import dape_tile
from bipe_jax.attention.pallas import layout


def _tile_grads(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref, w_ref,
                x_scr, logits_scr, z_scr, dx_scr, *, tile_bias, flat, scale, causal, on_p=None,
                grad_ref=None):
  """One (query tile, key tile): ds_h float32 [q, k] into logits_scr[h] (dape_tile.backward);
  on_p(h, p_h) sees each head's probabilities; grad_ref: the parameters' gradient rows."""
  group = q_ref.shape[0] // k_ref.shape[0]
  vis, streams = fwd.tile_logits(q_ref, k_ref, qi_ref, ki_ref, w_ref, x_scr, logits_scr, z_scr,
                                 tile_bias=tile_bias, flat=flat, scale=scale, causal=causal)
  for h in range(flat.heads):
    p = jnp.where(vis, jnp.exp(logits_scr[h] - layout.row_to_column(lse_ref[h])), 0.0)
    if on_p is not None:
      on_p(h, p)
    dp = jax.lax.dot_general(do_ref[h], v_ref[h // group], fwd.TRANS_A,  # [Dh, q] x [Dh, k]
                             preferred_element_type=jnp.float32)
    logits_scr[h] = p * (dp - layout.row_to_column(delta_ref[h]))  # dA
  dape_tile.backward(logits_scr, z_scr, x_scr, dx_scr, flat, lambda idx: w_ref[idx], grad_ref,
                     tile_bias, streams)


def _dq_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref,
               w_ref, dq_ref, dw_ref, dq_scr, dw_scr, x_scr, logits_scr, z_scr, dx_scr, *,
               tile_bias, flat, scale, causal, n_q_tiles, n_k_tiles):
  b, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  group = q_ref.shape[0] // k_ref.shape[0]

  @pl.when(j == 0)
  def _init_row():
    dq_scr[...] = jnp.zeros(dq_scr.shape, jnp.float32)

  @pl.when((i == 0) & (j == 0))
  def _init_batch_row():
    dw_scr[...] = jnp.zeros(dw_scr.shape, jnp.float32)

  @pl.when(fwd.runs(lo_ref, hi_ref, b, i, j, n_q_tiles))
  def _compute():
    _tile_grads(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref, w_ref, x_scr,
                logits_scr, z_scr, dx_scr, tile_bias=tile_bias, flat=flat, scale=scale,
                causal=causal, grad_ref=dw_scr)
    for h in range(flat.heads):
      k = k_ref[h // group]  # [Dh, k]; dQ^T = K^T dS^T
      dq_scr[h] += jax.lax.dot_general(k, logits_scr[h].astype(k.dtype), fwd.TRANS_B,
                                       preferred_element_type=jnp.float32) * scale

  @pl.when(j == n_k_tiles - 1)
  def _finish_row():
    dq_ref[...] = dq_scr[...].astype(dq_ref.dtype)

  @pl.when((i == n_q_tiles - 1) & (j == n_k_tiles - 1))
  def _finish_batch_row():
    dw_ref[...] = dw_scr[...]


def _dkv_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref,
                ki_ref, w_ref, dk_ref, dv_ref, dk_scr, dv_scr, x_scr, logits_scr, z_scr, dx_scr,
                *, tile_bias, flat, scale, causal, n_q_tiles, n_k_tiles):
  b, j, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  group = q_ref.shape[0] // k_ref.shape[0]

  @pl.when(i == 0)
  def _init():
    dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
    dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

  def on_p(h, p):  # dV^T = dO^T P
    do = do_ref[h]  # [Dh, q]
    dv_scr[h // group] += jnp.dot(do, p.astype(do.dtype), preferred_element_type=jnp.float32)

  @pl.when(fwd.runs(lo_ref, hi_ref, b, j, i, n_k_tiles))
  def _compute():
    _tile_grads(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref, w_ref, x_scr,
                logits_scr, z_scr, dx_scr, tile_bias=tile_bias, flat=flat, scale=scale,
                causal=causal, on_p=on_p)
    for h in range(flat.heads):
      q = q_ref[h]  # [Dh, q]; dK^T = Q^T dS
      dk_scr[h // group] += jnp.dot(q, logits_scr[h].astype(q.dtype),
                                    preferred_element_type=jnp.float32) * scale

  @pl.when(i == n_q_tiles - 1)
  def _finish():
    dk_ref[...] = dk_scr[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)


def backward(q, k, v, out, lse, d_out, flat_params, q_info, k_info, k_lo, k_hi, q_lo, q_hi, *,
             tile_bias, flat, scale: float, causal: bool, block_q: int, block_k: int,
             interpret: bool, vmem_limit_bytes=None):
  """(dq, dk, dv in the inputs' dtypes, d flat_params float32 [flat.size]); shapes as
  `dape_forward.forward`; k_lo / k_hi (per query tile) and q_lo / q_hi (per key tile):
  tile_ranges.py's ranges [B * n]."""
  b, h, d, tq = q.shape
  g, tk = k.shape[1], k.shape[3]
  n_q, n_k = tq // block_q, tk // block_k
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=2, keepdims=True)
  args = (q, k, v, d_out, lse, delta, q_info, k_info, flat_params)
  names = ('q', 'k', 'v', 'do', 'lse', 'delta', 'q_info', 'k_info', 'weights')
  statics = dict(tile_bias=tile_bias, flat=flat, scale=scale, causal=causal, n_q_tiles=n_q,
                 n_k_tiles=n_k)
  grad_shape = (flat.hidden + 1, flat.grad_rows, block_k)
  scratch = fwd.tile_scratch(flat, block_q, block_k, hidden=True) + [
      pltpu.VMEM((flat.features, block_q, block_k), jnp.float32)]  # dx
  dq_cost, dkv_cost = dape_cost.backward_cost(b, h, g, tq, tk, d, block_q, block_k, causal,
                                              q.dtype.itemsize, flat, k_lo.size,
                                              tile_bias.kind)

  s = fwd.specs(b, h, g, d, n_q, n_k, block_q, block_k, key_outer=False)
  dq, dw = pl.pallas_call(
      functools.partial(_dq_kernel, **statics),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2, grid=(b, n_q, n_k), in_specs=[s[n] for n in names],
          out_specs=[pl.BlockSpec((None, h, d, block_q), lambda bb, i, j, *_: (bb, 0, 0, i)),
                     pl.BlockSpec((None, *grad_shape), lambda bb, i, j, *_: (bb, 0, 0, 0))],
          scratch_shapes=[pltpu.VMEM((h, d, block_q), jnp.float32),
                          pltpu.VMEM(grad_shape, jnp.float32), *scratch]),
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, *grad_shape), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'arbitrary', 'arbitrary'),
          vmem_limit_bytes=vmem_limit_bytes),
      cost_estimate=dq_cost,
      interpret=interpret,
  )(k_lo, k_hi, *args)

  s = fwd.specs(b, h, g, d, n_q, n_k, block_q, block_k, key_outer=True)
  kv_out = pl.BlockSpec((None, g, d, block_k), lambda bb, j, i, *_: (bb, 0, 0, j))
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, **statics),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2, grid=(b, n_k, n_q), in_specs=[s[n] for n in names],
          out_specs=[kv_out, kv_out],
          scratch_shapes=[pltpu.VMEM((g, d, block_k), jnp.float32),
                          pltpu.VMEM((g, d, block_k), jnp.float32), *scratch]),
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'arbitrary'),
          vmem_limit_bytes=vmem_limit_bytes),
      cost_estimate=dkv_cost,
      interpret=interpret,
  )(q_lo, q_hi, *args)
  d_flat = flat.grad_rows_to_flat(jnp.sum(dw, axis=(0, 3)))
  return dq, dk, dv, d_flat
