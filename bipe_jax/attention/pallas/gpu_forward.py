"""The forward GPU (Triton) kernel: online-softmax attention with the bias computed per tile.

Grid (B, H, query tiles). One program holds a query tile [block_q, Dh] and walks the key tiles of
its KV head in a loop (GPU programs keep no scratch across grid steps, unlike the TPU kernel's
"arbitrary" axis); a key tile whose smallest causal index exceeds the query tile's largest is
skipped. Outputs the attention [B, H, Tq, Dh] and the per-row log-sum-exp [B, H, Tq] (0 for a
row that sees no key), the only residual the backward needs. GQA: query head h reads KV head
h // (H / G). Block sizes, Dh and the number of bias parameters must be powers of two for
Triton (interpret mode takes any).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jax.experimental.pallas import triton as pltriton

from bipe_jax.kernels.gqa_products import NEG_INF
from bipe_jax.attention.pallas import gpu_tiles
from bipe_jax.attention.pallas import layout


def _forward_kernel(q_ref, k_ref, v_ref, qi_ref, ki_ref, params_ref, o_ref, lse_ref, *,
                    tile_bias, scale, causal, block_q, block_k, n_k_tiles):
  q = q_ref[...]
  q_fields = gpu_tiles.query_fields(qi_ref, pl.ds(0, block_q))
  q_max = jnp.max(q_fields[0])
  param = lambda n: params_ref[n]  # pylint: disable=unnecessary-lambda-assignment

  def body(j, carry):
    cols = pl.ds(j * block_k, block_k)
    k_fields = gpu_tiles.key_fields(ki_ref, cols)

    def compute(state):
      m, l, acc = state
      s, vis = gpu_tiles.tile_logits(q, k_ref[cols, :], q_fields, k_fields, param,
                                     tile_bias=tile_bias, scale=scale, causal=causal)
      m_new = jnp.maximum(m, jnp.max(s, axis=1))
      p = jnp.where(vis, jnp.exp(s - m_new[:, None]), 0.0)
      corr = jnp.exp(m - m_new)
      v = v_ref[cols, :]
      acc = corr[:, None] * acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
      return m_new, corr * l + jnp.sum(p, axis=1), acc

    return gpu_tiles.maybe(causal, jnp.min(k_fields[0]) <= q_max, compute, carry)

  init = (jnp.full((block_q,), NEG_INF, jnp.float32), jnp.zeros((block_q,), jnp.float32),
          jnp.zeros(q.shape, jnp.float32))
  m, l, acc = jax.lax.fori_loop(0, n_k_tiles, body, init)
  seen = l > 0.0
  safe_l = jnp.where(seen, l, 1.0)
  o_ref[...] = (acc / safe_l[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log(safe_l), 0.0)


def side_specs(block_q: int, tk: int, num_params: int, q_tile_of):
  """BlockSpecs of q_info [B, Tq, INFO] (one query tile), k_info [B, INFO, Tk] (all keys) and
  params [H, P] (one head); `q_tile_of(*grid)` -> (batch, query tile, head)."""
  return [pl.BlockSpec((None, block_q, layout.INFO), lambda *a: (q_tile_of(*a)[0],
                                                                 q_tile_of(*a)[1], 0)),
          pl.BlockSpec((None, layout.INFO, tk), lambda *a: (q_tile_of(*a)[0], 0, 0)),
          pl.BlockSpec((None, num_params), lambda *a: (q_tile_of(*a)[2], 0))]


def forward(q, k, v, params_HxP, q_info, k_info, *, tile_bias, scale: float, causal: bool,
            block_q: int, block_k: int, interpret: bool, num_warps: int = 4):
  """(out [B, H, Tq, Dh] in q's dtype, lse float32 [B, H, Tq]); Tq, Tk multiples of the blocks
  (pad first: bipe_jax.attention.pallas.layout)."""
  b, h, tq, d = q.shape
  g, tk = k.shape[1], k.shape[2]
  r = h // g
  params = params_HxP.astype(jnp.float32)
  kernel = functools.partial(_forward_kernel, tile_bias=tile_bias, scale=scale, causal=causal,
                             block_q=block_q, block_k=block_k, n_k_tiles=tk // block_k)
  q_spec = pl.BlockSpec((None, None, block_q, d), lambda bb, hh, i: (bb, hh, i, 0))
  kv_spec = pl.BlockSpec((None, None, tk, d), lambda bb, hh, i: (bb, jax.lax.div(hh, r), 0, 0))
  sides = side_specs(block_q, tk, params.shape[-1], lambda bb, hh, i: (bb, i, hh))
  return pl.pallas_call(
      kernel,
      grid=(b, h, tq // block_q),
      in_specs=[q_spec, kv_spec, kv_spec, *sides],
      out_specs=[q_spec, pl.BlockSpec((None, None, block_q), lambda bb, hh, i: (bb, hh, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, tq), jnp.float32)],
      compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=2),
      interpret=interpret,
  )(q, k, v, q_info, k_info, params)

