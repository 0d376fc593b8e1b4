"""The fused DAPE V1 backward GPU (Triton) kernels: dQ with the parameters' gradients, and dK / dV.

Both recompute each tile of all heads (gpu_dape_forward.tile: scores, biases, DAPE's MLP, mask)
and the probabilities from the forward's log-sum-exp, p_h = exp(A_h - lse_h); with
delta_h = rowsum(dO_h * O_h) (computed outside):
  dA_h = p_h * (dO_h V^T - delta_h),  (ds_h, db_h) = the MLP's backward of dA (gpu_dape_tiles),
  dQ_h = scale ds_h K,  dK_g = scale sum_{h of g} ds_h^T Q_h,  dV_g = sum_{h of g} p_h^T dO_h.
dQ kernel: grid (B, query tiles), a loop over key tiles; it also writes each query tile's
  gradient of the packed parameters [B, n_q_tiles, padded size] (summed outside): d w_in, d b_in,
  d w_out, d b_out from the MLP, the bias parameters' from `TileBias.param_grad_tiles(db)`.
dK / dV kernel: grid (B, key tiles), a loop over query tiles; every head in one program (the
  MLP couples the heads), GQA's sum over a group in registers.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from bipe_jax.attention.pallas import gpu_dape_forward
from bipe_jax.attention.pallas import gpu_dape_tiles
from bipe_jax.attention.pallas import gpu_tiles
from bipe_jax.attention.pallas import layout


def _cotangents(q_list, k_list, v_list, do_list, lse_list, delta_list, q_fields, k_fields, w,
                statics, grads: bool):
  """(p [H], ds [H], db [H] of float32 [q, k], gradient terms) of one tile (every head); v_list
  [G] of [k, Dh], lse / delta [H] of [q]."""
  group = len(q_list) // len(k_list)
  s_list, b_list, logits, vis = gpu_dape_forward.tile(q_list, k_list, q_fields, k_fields, w,
                                                      **statics)
  p_list, da_list = [], []
  for h, a in enumerate(logits):
    p = jnp.where(vis, jnp.exp(a - lse_list[h][:, None]), 0.0)
    dp = jax.lax.dot_general(do_list[h], v_list[h // group], gpu_tiles.TRANS_B,
                             preferred_element_type=jnp.float32)
    p_list.append(p)
    da_list.append(p * (dp - delta_list[h][:, None]))
  ds, db, terms = gpu_dape_tiles.mlp_backward(da_list, s_list, b_list, statics['flat'], w,
                                              grads=grads)
  return p_list, ds, db, terms


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref, w_ref, dq_ref,
               dw_ref, *, statics, block_q, block_k, n_k_tiles):
  flat, tile_bias = statics['flat'], statics['tile_bias']
  h_count, g_count = flat.heads, k_ref.shape[0]
  q_list = [q_ref[h, :, :] for h in range(h_count)]
  do_list = [do_ref[h, :, :] for h in range(h_count)]
  lse_list = [lse_ref[h, :] for h in range(h_count)]
  delta_list = [delta_ref[h, :] for h in range(h_count)]
  q_fields = gpu_tiles.query_fields(qi_ref, pl.ds(0, block_q))
  q_max = jnp.max(q_fields[0])
  w = lambda i: w_ref[i]  # pylint: disable=unnecessary-lambda-assignment
  size = dw_ref.shape[-1]

  def body(j, carry):
    cols = pl.ds(j * block_k, block_k)
    k_fields = gpu_tiles.key_fields(ki_ref, cols)

    def compute(state):
      dq, dw = state
      k_list = [k_ref[g, cols, :] for g in range(g_count)]
      v_list = [v_ref[g, cols, :] for g in range(g_count)]
      _, ds, db, terms = _cotangents(q_list, k_list, v_list, do_list, lse_list, delta_list,
                                     q_fields, k_fields, w, statics, grads=True)
      for h in range(h_count):
        param = lambda n, h=h: w(flat.bias(h, n))
        bias_terms = tile_bias.param_grad_tiles(param, q_fields[1], k_fields[1], db[h])
        terms += [(flat.bias(h, n), jnp.sum(t)) for n, t in enumerate(bias_terms)]
      group = h_count // g_count
      dq = tuple(acc + jnp.dot(ds[h].astype(k_list[h // group].dtype), k_list[h // group],
                               preferred_element_type=jnp.float32)
                 for h, acc in enumerate(dq))
      return dq, dw + gpu_dape_tiles.grad_vector(terms, size)

    return gpu_tiles.maybe(statics['causal'], jnp.min(k_fields[0]) <= q_max, compute, carry)

  init = (tuple(jnp.zeros(q.shape, jnp.float32) for q in q_list),
          jnp.zeros((size,), jnp.float32))
  dq, dw = jax.lax.fori_loop(0, n_k_tiles, body, init)
  for h, acc in enumerate(dq):
    dq_ref[h, :, :] = (acc * statics['scale']).astype(dq_ref.dtype)
  dw_ref[...] = dw


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qi_ref, ki_ref, w_ref, dk_ref,
                dv_ref, *, statics, block_q, block_k, n_q_tiles):
  h_count, g_count = statics['flat'].heads, k_ref.shape[0]
  group = h_count // g_count
  k_list = [k_ref[g, :, :] for g in range(g_count)]
  v_list = [v_ref[g, :, :] for g in range(g_count)]
  k_fields = gpu_tiles.key_fields(ki_ref, pl.ds(0, block_k))
  k_min = jnp.min(k_fields[0])
  w = lambda i: w_ref[i]  # pylint: disable=unnecessary-lambda-assignment

  def body(i, carry):
    rows = pl.ds(i * block_q, block_q)
    q_fields = gpu_tiles.query_fields(qi_ref, rows)

    def compute(state):
      dk, dv = (list(x) for x in state)
      q_list = [q_ref[h, rows, :] for h in range(h_count)]
      do_list = [do_ref[h, rows, :] for h in range(h_count)]
      p, ds, _, _ = _cotangents(
          q_list, k_list, v_list, do_list, [lse_ref[h, rows] for h in range(h_count)],
          [delta_ref[h, rows] for h in range(h_count)], q_fields, k_fields, w, statics,
          grads=False)
      for h in range(h_count):
        g = h // group
        dv[g] = dv[g] + jax.lax.dot_general(p[h].astype(do_list[h].dtype), do_list[h],
                                            gpu_tiles.TRANS_A, preferred_element_type=jnp.float32)
        dk[g] = dk[g] + jax.lax.dot_general(ds[h].astype(q_list[h].dtype), q_list[h],
                                            gpu_tiles.TRANS_A, preferred_element_type=jnp.float32)
      return tuple(dk), tuple(dv)

    return gpu_tiles.maybe(statics['causal'], k_min <= jnp.max(q_fields[0]), compute, carry)

  zeros = tuple(jnp.zeros(k.shape, jnp.float32) for k in k_list)
  dk, dv = jax.lax.fori_loop(0, n_q_tiles, body, (zeros, zeros))
  for g in range(g_count):
    dk_ref[g, :, :] = (dk[g] * statics['scale']).astype(dk_ref.dtype)
    dv_ref[g, :, :] = dv[g].astype(dv_ref.dtype)


def backward(q, k, v, out, lse, d_out, params, q_info, k_info, *, flat, tile_bias, scale: float,
             causal: bool, block_q: int, block_k: int, interpret: bool, num_warps: int = 4):
  """(dq, dk, dv in the inputs' dtypes, d params float32 [padded size]); shapes as
  gpu_dape_forward.forward."""
  b, h, tq, d = q.shape
  g, tk = k.shape[1], k.shape[2]
  n_q, n_k = tq // block_q, tk // block_k
  size = params.shape[0]
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
  args = (q, k, v, d_out, lse, delta, q_info, k_info, params)
  statics = dict(tile_bias=tile_bias, flat=flat, scale=scale, causal=causal)
  compiler = pltriton.CompilerParams(num_warps=num_warps, num_stages=2)
  w_spec = pl.BlockSpec((size,), lambda bb, x: (0,))

  # dQ and the parameters: one query tile of every head against all keys.
  q_tile = pl.BlockSpec((None, h, block_q, d), lambda bb, i: (bb, 0, i, 0))
  all_kv = pl.BlockSpec((None, g, tk, d), lambda bb, i: (bb, 0, 0, 0))
  q_row = pl.BlockSpec((None, h, block_q), lambda bb, i: (bb, 0, i))
  dq, dw = pl.pallas_call(
      functools.partial(_dq_kernel, statics=statics, block_q=block_q, block_k=block_k,
                        n_k_tiles=n_k),
      grid=(b, n_q),
      in_specs=[q_tile, all_kv, all_kv, q_tile, q_row, q_row,
                pl.BlockSpec((None, block_q, layout.INFO), lambda bb, i: (bb, i, 0)),
                pl.BlockSpec((None, layout.INFO, tk), lambda bb, i: (bb, 0, 0)), w_spec],
      out_specs=[q_tile, pl.BlockSpec((None, None, size), lambda bb, i: (bb, i, 0))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, n_q, size), jnp.float32)],
      compiler_params=compiler, interpret=interpret,
  )(*args)

  # dK / dV: one key tile of every KV head against all query tiles of every head.
  all_q = pl.BlockSpec((None, h, tq, d), lambda bb, j: (bb, 0, 0, 0))
  all_rows = pl.BlockSpec((None, h, tq), lambda bb, j: (bb, 0, 0))
  kv_tile = pl.BlockSpec((None, g, block_k, d), lambda bb, j: (bb, 0, j, 0))
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, statics=statics, block_q=block_q, block_k=block_k,
                        n_q_tiles=n_q),
      grid=(b, n_k),
      in_specs=[all_q, kv_tile, kv_tile, all_q, all_rows, all_rows,
                pl.BlockSpec((None, tq, layout.INFO), lambda bb, j: (bb, 0, 0)),
                pl.BlockSpec((None, layout.INFO, block_k), lambda bb, j: (bb, 0, j)), w_spec],
      out_specs=[kv_tile, kv_tile],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      compiler_params=compiler, interpret=interpret,
  )(*args)
  return dq, dk, dv, jnp.sum(dw, axis=(0, 1))
