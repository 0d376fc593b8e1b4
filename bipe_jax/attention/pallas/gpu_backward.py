"""The backward GPU (Triton) kernels: dQ with the bias parameters' gradient, and dK / dV.

Both recompute each tile's logits and bias from the position slices and its probabilities from
the forward's log-sum-exp, p = exp(s - lse), so nothing of size [Tq, Tk] is stored. With
delta = rowsum(dO * O) (computed outside, [B, H, Tq]):
  dS = p * (dO V^T - delta),  dQ = scale dS K,  dK = scale dS^T Q,  dV = p^T dO,
  d params[h, n] = sum over tiles of the n-th `TileBias.param_grad_tiles(dS)`.
dQ kernel: grid (B, H, query tiles), a loop over key tiles; it also writes each query tile's
  parameter gradient [B, H, n_q_tiles, P] (summed outside).
dK / dV kernel: grid (B, G, key tiles), a loop over the query heads of the KV group and their
  query tiles (GQA's sum over the group happens in registers).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from bipe_jax.attention.pallas import gpu_tiles
from bipe_jax.attention.pallas import layout


def _probabilities(q, k, v, do, lse, delta, q_fields, k_fields, param, statics):
  """(p, dS) float32 [q, k] of one tile; lse, delta [q]."""
  s, vis = gpu_tiles.tile_logits(q, k, q_fields, k_fields, param, **statics)
  p = jnp.where(vis, jnp.exp(s - lse[:, None]), 0.0)
  dp = jax.lax.dot_general(do, v, gpu_tiles.TRANS_B, preferred_element_type=jnp.float32)
  return p, p * (dp - delta[:, None])


def _param_vector(terms, num_params: int):
  """[P] float32 holding the sums of `terms` (P [q, k] tiles) at their indices."""
  index = jnp.arange(num_params)
  out = jnp.zeros((num_params,), jnp.float32)
  for n, term in enumerate(terms):
    out = out + jnp.where(index == n, jnp.sum(term), 0.0)
  return out


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref, params_ref,
               dq_ref, dparams_ref, *, statics, block_q, block_k, n_k_tiles, num_params):
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
  q_fields = gpu_tiles.query_fields(qi_ref, pl.ds(0, block_q))
  q_max = jnp.max(q_fields[0])
  param = lambda n: params_ref[n]  # pylint: disable=unnecessary-lambda-assignment

  def body(j, carry):
    cols = pl.ds(j * block_k, block_k)
    k_fields = gpu_tiles.key_fields(ki_ref, cols)

    def compute(state):
      dq, dparams = state
      k = k_ref[cols, :]
      _, ds = _probabilities(q, k, v_ref[cols, :], do, lse, delta, q_fields, k_fields, param,
                             statics)
      dq = dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)
      terms = statics['tile_bias'].param_grad_tiles(param, q_fields[1], k_fields[1], ds)
      return dq, dparams + _param_vector(terms, num_params)

    return gpu_tiles.maybe(statics['causal'], jnp.min(k_fields[0]) <= q_max, compute, carry)

  init = (jnp.zeros(q.shape, jnp.float32), jnp.zeros((num_params,), jnp.float32))
  dq, dparams = jax.lax.fori_loop(0, n_k_tiles, body, init)
  dq_ref[...] = (dq * statics['scale']).astype(dq_ref.dtype)
  dparams_ref[...] = dparams


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref, params_ref,
                dk_ref, dv_ref, *, statics, block_q, block_k, n_q_tiles, group):
  k, v = k_ref[...], v_ref[...]
  k_fields = gpu_tiles.key_fields(ki_ref, pl.ds(0, block_k))
  k_min = jnp.min(k_fields[0])

  def over_query_tiles(head, carry):
    param = lambda n: params_ref[head, n]  # pylint: disable=unnecessary-lambda-assignment

    def body(i, carry):
      rows = pl.ds(i * block_q, block_q)
      q_fields = gpu_tiles.query_fields(qi_ref, rows)

      def compute(state):
        dk, dv = state
        q, do = q_ref[head, rows, :], do_ref[head, rows, :]
        p, ds = _probabilities(q, k, v, do, lse_ref[head, rows], delta_ref[head, rows],
                               q_fields, k_fields, param, statics)
        dv = dv + jax.lax.dot_general(p.astype(do.dtype), do, gpu_tiles.TRANS_A,
                                      preferred_element_type=jnp.float32)
        dk = dk + jax.lax.dot_general(ds.astype(q.dtype), q, gpu_tiles.TRANS_A,
                                      preferred_element_type=jnp.float32)
        return dk, dv

      return gpu_tiles.maybe(statics['causal'], k_min <= jnp.max(q_fields[0]), compute, carry)

    return jax.lax.fori_loop(0, n_q_tiles, body, carry)

  init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
  dk, dv = jax.lax.fori_loop(0, group, over_query_tiles, init)
  dk_ref[...] = (dk * statics['scale']).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def backward(q, k, v, out, lse, d_out, params_HxP, q_info, k_info, *, tile_bias, scale: float,
             causal: bool, block_q: int, block_k: int, interpret: bool, num_warps: int = 4):
  """(dq, dk, dv in the inputs' dtypes, d params float32 [H, P]); shapes as gpu_forward.forward."""
  b, h, tq, d = q.shape
  g, tk = k.shape[1], k.shape[2]
  r = h // g
  n_q, n_k = tq // block_q, tk // block_k
  num_params = params_HxP.shape[-1]
  params = params_HxP.astype(jnp.float32)
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
  args = (q, k, v, d_out, lse, delta, q_info, k_info, params)
  statics = dict(tile_bias=tile_bias, scale=scale, causal=causal)
  compiler = pltriton.CompilerParams(num_warps=num_warps, num_stages=2)

  # dQ: one query tile of one head against all keys of its KV head.
  q_tile = pl.BlockSpec((None, None, block_q, d), lambda bb, hh, i: (bb, hh, i, 0))
  all_kv = pl.BlockSpec((None, None, tk, d), lambda bb, hh, i: (bb, jax.lax.div(hh, r), 0, 0))
  q_row = pl.BlockSpec((None, None, block_q), lambda bb, hh, i: (bb, hh, i))
  dq, dparams = pl.pallas_call(
      functools.partial(_dq_kernel, statics=statics, block_q=block_q, block_k=block_k,
                        n_k_tiles=n_k, num_params=num_params),
      grid=(b, h, n_q),
      in_specs=[q_tile, all_kv, all_kv, q_tile, q_row, q_row,
                pl.BlockSpec((None, block_q, layout.INFO), lambda bb, hh, i: (bb, i, 0)),
                pl.BlockSpec((None, layout.INFO, tk), lambda bb, hh, i: (bb, 0, 0)),
                pl.BlockSpec((None, num_params), lambda bb, hh, i: (hh, 0))],
      out_specs=[q_tile, pl.BlockSpec((None, None, None, num_params),
                                      lambda bb, hh, i: (bb, hh, i, 0))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, n_q, num_params), jnp.float32)],
      compiler_params=compiler, interpret=interpret,
  )(*args)

  # dK / dV: one key tile of one KV head against all query tiles of its r query heads.
  group_q = pl.BlockSpec((None, r, tq, d), lambda bb, gg, j: (bb, gg, 0, 0))
  group_row = pl.BlockSpec((None, r, tq), lambda bb, gg, j: (bb, gg, 0))
  kv_tile = pl.BlockSpec((None, None, block_k, d), lambda bb, gg, j: (bb, gg, j, 0))
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, statics=statics, block_q=block_q, block_k=block_k,
                        n_q_tiles=n_q, group=r),
      grid=(b, g, n_k),
      in_specs=[group_q, kv_tile, kv_tile, group_q, group_row, group_row,
                pl.BlockSpec((None, tq, layout.INFO), lambda bb, gg, j: (bb, 0, 0)),
                pl.BlockSpec((None, layout.INFO, block_k), lambda bb, gg, j: (bb, 0, j)),
                pl.BlockSpec((r, num_params), lambda bb, gg, j: (gg, 0))],
      out_specs=[kv_tile, kv_tile],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      compiler_params=compiler, interpret=interpret,
  )(*args)
  return dq, dk, dv, jnp.sum(dparams, axis=(0, 2))
