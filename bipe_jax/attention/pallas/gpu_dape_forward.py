"""The fused DAPE V1 forward GPU (Triton) kernel: all heads of a query tile, DAPE's MLP across
them, an online softmax per head.

Grid (B, query tiles). A program holds the query tile of every head [H, block_q, Dh] and walks
the key tiles of all KV heads in a loop (GQA: head h reads KV head h // (H / G)). Per key tile:
each head's scaled scores and static bias (tile_bias.py, from the position slices), the MLP
across the heads (gpu_dape_tiles.py; the weights and the bias parameters are scalars of one
packed float32 vector, dape_tile.FlatParams, padded to a power of two), the mask, and per head
the online-softmax update. A key tile whose smallest causal index exceeds the query tile's
largest is skipped. Outputs the attention [B, H, Tq, Dh] and the log-sum-exp rows [B, H, Tq]
(0 for a row that sees no key).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from bipe_jax.attention.pallas import dape_tile
from bipe_jax.attention.pallas import gpu_dape_tiles
from bipe_jax.attention.pallas import gpu_tiles
from bipe_jax.attention.pallas import layout
from bipe_jax.kernels.gqa_products import NEG_INF


def tile(q_list, k_list, q_fields, k_fields, w, *, tile_bias, flat, scale, causal):
  """(scores [H], biases [H], masked adapted logits [H] of float32 [q, k], visible bool
  [q, k]) of one tile: q_list [H] of [q, Dh], k_list [G] of [k, Dh]."""
  group = len(q_list) // len(k_list)
  s_list = [jax.lax.dot_general(q, k_list[h // group], gpu_tiles.TRANS_B,
                                preferred_element_type=jnp.float32) * scale
            for h, q in enumerate(q_list)]
  b_list = [dape_tile.head_bias(tile_bias, flat, w, h, q_fields[1], k_fields[1])
            for h in range(flat.heads)]
  logits = gpu_dape_tiles.adapted_logits(s_list, b_list, flat, w)
  vis = gpu_tiles.visible(q_fields, k_fields, causal)
  return s_list, b_list, [jnp.where(vis, a, NEG_INF) for a in logits], vis


def _kernel(q_ref, k_ref, v_ref, qi_ref, ki_ref, w_ref, o_ref, lse_ref, *, tile_bias, flat,
            scale, causal, block_q, block_k, n_k_tiles):
  h_count, g_count = flat.heads, k_ref.shape[0]
  group = h_count // g_count
  q_list = [q_ref[h, :, :] for h in range(h_count)]
  q_fields = gpu_tiles.query_fields(qi_ref, pl.ds(0, block_q))
  q_max = jnp.max(q_fields[0])
  w = lambda i: w_ref[i]  # pylint: disable=unnecessary-lambda-assignment

  def body(j, carry):
    cols = pl.ds(j * block_k, block_k)
    k_fields = gpu_tiles.key_fields(ki_ref, cols)

    def compute(state):
      k_list = [k_ref[g, cols, :] for g in range(g_count)]
      _, _, logits, vis = tile(q_list, k_list, q_fields, k_fields, w, tile_bias=tile_bias,
                               flat=flat, scale=scale, causal=causal)
      out = []
      for h, ((m, l, acc), a) in enumerate(zip(state, logits)):
        m_new = jnp.maximum(m, jnp.max(a, axis=1))
        p = jnp.where(vis, jnp.exp(a - m_new[:, None]), 0.0)
        corr = jnp.exp(m - m_new)
        v = v_ref[h // group, cols, :]
        acc = corr[:, None] * acc + jnp.dot(p.astype(v.dtype), v,
                                            preferred_element_type=jnp.float32)
        out.append((m_new, corr * l + jnp.sum(p, axis=1), acc))
      return tuple(out)

    return gpu_tiles.maybe(causal, jnp.min(k_fields[0]) <= q_max, compute, carry)

  init = tuple((jnp.full((block_q,), NEG_INF, jnp.float32), jnp.zeros((block_q,), jnp.float32),
                jnp.zeros(q_list[0].shape, jnp.float32)) for _ in range(h_count))
  state = jax.lax.fori_loop(0, n_k_tiles, body, init)
  for h, (m, l, acc) in enumerate(state):
    seen = l > 0.0
    safe_l = jnp.where(seen, l, 1.0)
    o_ref[h, :, :] = (acc / safe_l[:, None]).astype(o_ref.dtype)
    lse_ref[h, :] = jnp.where(seen, m + jnp.log(safe_l), 0.0)


def forward(q, k, v, params, q_info, k_info, *, flat, tile_bias, scale: float, causal: bool,
            block_q: int, block_k: int, interpret: bool, num_warps: int = 4):
  """(out [B, H, Tq, Dh] in q's dtype, lse float32 [B, H, Tq]) from q [B, H, Tq, Dh], k, v
  [B, G, Tk, Dh] (Tq, Tk multiples of the blocks), the packed parameters float32
  [gpu_dape_tiles.padded_size(flat)] and the side arrays (layout.query_info, layout.key_info)."""
  b, h, tq, d = q.shape
  g, tk = k.shape[1], k.shape[2]
  kernel = functools.partial(_kernel, tile_bias=tile_bias, flat=flat, scale=scale,
                             causal=causal, block_q=block_q, block_k=block_k,
                             n_k_tiles=tk // block_k)
  q_spec = pl.BlockSpec((None, h, block_q, d), lambda bb, i: (bb, 0, i, 0))
  kv_spec = pl.BlockSpec((None, g, tk, d), lambda bb, i: (bb, 0, 0, 0))
  return pl.pallas_call(
      kernel,
      grid=(b, tq // block_q),
      in_specs=[q_spec, kv_spec, kv_spec,
                pl.BlockSpec((None, block_q, layout.INFO), lambda bb, i: (bb, i, 0)),
                pl.BlockSpec((None, layout.INFO, tk), lambda bb, i: (bb, 0, 0)),
                pl.BlockSpec((params.shape[0],), lambda bb, i: (0,))],
      out_specs=[q_spec, pl.BlockSpec((None, h, block_q), lambda bb, i: (bb, 0, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, tq), jnp.float32)],
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=2),
      interpret=interpret,
  )(q, k, v, q_info, k_info, params)
