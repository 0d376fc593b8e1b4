"""The fused DAPE V1 forward Pallas kernel: all heads of a tile, DAPE's MLP across them, then an
online softmax per head.

Grid (B, query tiles, key tiles), key tiles innermost ("arbitrary"). A step holds every head:
q [H, Dh, bq], k / v [G, Dh, bk] (forward.py's layout, tokens in lanes; GQA: head h reads KV
head h // (H / G)). Per step: the scores of each head, its static bias from the position
slices (tile_bias.py), DAPE's MLP across the heads (dape_tile.py, the weights and the bias
parameters as one SMEM vector), the mask (causal, documents, padding: layout.visible), and
per head the online-softmax update of the running max, normaliser and weighted sum (VMEM
scratch across the key tiles). Only the key tiles of each query tile's range are computed and
fetched (tile_ranges.py: the key-side index maps clamp the key tile into the range).
Outputs the attention [B, H, Dh, Tq] and the log-sum-exp rows [B, H, 1, Tq] (0 for a row that
sees no key).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bipe_jax.attention.pallas import dape_cost
from bipe_jax.attention.pallas import dape_tile
from bipe_jax.attention.pallas import layout
from bipe_jax.attention.pallas import tile_ranges
from bipe_jax.kernels.gqa_products import NEG_INF

TRANS_A = (((0,), (0,)), ((), ()))  # contract the first axis of both operands
TRANS_B = (((1,), (1,)), ((), ()))  # contract the last axis of both operands


def fetch(lo_ref, hi_ref, b, i, step, n: int):
  """The block step `step` of row i of batch row b fetches (clamped into the row's range)."""
  r = b * n + i
  return tile_ranges.fetch_index(step, lo_ref[r], hi_ref[r])


def runs(lo_ref, hi_ref, b, i, step, n: int):
  """Whether step `step` of row i of batch row b is inside the row's range."""
  r = b * n + i
  return tile_ranges.runs(step, lo_ref[r], hi_ref[r])


def tile_logits(q_ref, k_ref, qi_ref, ki_ref, w_ref, x_ref, logits_ref, z_ref=None, *,
                tile_bias, flat, scale, causal):
  """(visible bool [q, k], (q streams [q, 1], k streams [1, k])) of one (query tile, key tile),
  its masked logits float32 [H, q, k] written to logits_ref (dape_tile.forward; the features to
  x_ref [C, q, k], with z_ref the hidden pre-activations [N, q, k]); q_ref [H, Dh, q], k_ref
  [G, Dh, k], w_ref the packed parameters (SMEM)."""
  group = q_ref.shape[0] // k_ref.shape[0]
  qi, ki = layout.query_columns(qi_ref[...]), ki_ref[...]
  streams = layout.streams(qi, ki)
  w = lambda idx: w_ref[idx]
  s_fn = lambda h: jax.lax.dot_general(q_ref[h], k_ref[h // group], TRANS_A,
                                       preferred_element_type=jnp.float32) * scale
  b_fn = lambda h: dape_tile.head_bias(tile_bias, flat, w, h, *streams)
  dape_tile.forward(s_fn, b_fn, flat, w, x_ref, logits_ref, z_ref)
  vis = layout.visible(qi, ki, causal)
  for h in range(flat.heads):
    logits_ref[h] = jnp.where(vis, logits_ref[h], NEG_INF)
  return vis, streams


def tile_scratch(flat, block_q: int, block_k: int, hidden: bool) -> list:
  """VMEM scratch of `tile_logits`: the features [C, q, k], the logits [H, q, k] and (`hidden`)
  the hidden pre-activations [N, q, k], float32."""
  shapes = [(flat.features, block_q, block_k), (flat.heads, block_q, block_k)]
  if hidden:
    shapes.append((flat.hidden, block_q, block_k))
  return [pltpu.VMEM(shape, jnp.float32) for shape in shapes]


def _kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, qi_ref, ki_ref, w_ref, o_ref, lse_ref, m_scr,
            l_scr, acc_scr, x_scr, logits_scr, *, tile_bias, flat, scale, causal, n_q_tiles,
            n_k_tiles):
  b, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  h_count, g_count = q_ref.shape[0], k_ref.shape[0]
  group = h_count // g_count

  @pl.when(j == 0)
  def _init():
    m_scr[...] = jnp.full(m_scr.shape, NEG_INF, jnp.float32)
    l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
    acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

  @pl.when(runs(lo_ref, hi_ref, b, i, j, n_q_tiles))
  def _compute():
    vis, _ = tile_logits(q_ref, k_ref, qi_ref, ki_ref, w_ref, x_scr, logits_scr,
                         tile_bias=tile_bias, flat=flat, scale=scale, causal=causal)
    for h in range(h_count):
      logits = logits_scr[h]
      m_prev = m_scr[h]
      m_new = jnp.maximum(m_prev, jnp.max(logits, axis=1, keepdims=True))
      p = jnp.where(vis, jnp.exp(logits - m_new), 0.0)
      corr = jnp.exp(m_prev - m_new)
      l_scr[h] = corr * l_scr[h] + jnp.sum(p, axis=1, keepdims=True)
      v = v_ref[h // group]  # [Dh, k]
      acc_scr[h] = corr * acc_scr[h] + jax.lax.dot_general(
          p.astype(v.dtype), v, TRANS_B, preferred_element_type=jnp.float32)
      m_scr[h] = m_new

  @pl.when(j == n_k_tiles - 1)
  def _finish():
    for h in range(h_count):
      l = l_scr[h]
      seen = l > 0.0
      o_ref[h] = (acc_scr[h] / jnp.where(seen, l, 1.0)).T.astype(o_ref.dtype)  # [Dh, q]
      lse = jnp.where(seen, m_scr[h] + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
      lse_ref[h] = layout.column_to_row(lse)


def specs(b, h, g, d, n_q, n_k, block_q, block_k, *, key_outer: bool):
  """In-specs (q, k, v, dO, lse, delta, q_info, k_info, weights) of a grid (B, i, j) with key
  tiles innermost (key_outer False: the forward's and dQ's) or (B, j, i) with query tiles
  innermost (key_outer True: dK / dV's); the inner side clamped into the outer tile's range
  (scalar prefetch lo, hi)."""
  def tiles(bb, x, y, lo_ref, hi_ref):  # (batch, query tile, key tile)
    if key_outer:
      return bb, fetch(lo_ref, hi_ref, bb, x, y, n_k), x
    return bb, x, fetch(lo_ref, hi_ref, bb, x, y, n_q)

  q_side = pl.BlockSpec((None, h, d, block_q), lambda *a: (tiles(*a)[0], 0, 0, tiles(*a)[1]))
  kv = pl.BlockSpec((None, g, d, block_k), lambda *a: (tiles(*a)[0], 0, 0, tiles(*a)[2]))
  row = pl.BlockSpec((None, h, 1, block_q), lambda *a: (tiles(*a)[0], 0, 0, tiles(*a)[1]))
  qi = pl.BlockSpec((None, layout.INFO, block_q), lambda *a: (tiles(*a)[0], 0, tiles(*a)[1]))
  ki = pl.BlockSpec((None, layout.INFO, block_k), lambda *a: (tiles(*a)[0], 0, tiles(*a)[2]))
  weights = pl.BlockSpec(memory_space=pltpu.SMEM)
  return dict(q=q_side, k=kv, v=kv, do=q_side, lse=row, delta=row, q_info=qi, k_info=ki,
              weights=weights)


def forward(q, k, v, flat_params, q_info, k_info, k_lo, k_hi, *, tile_bias, flat, scale: float,
            causal: bool, block_q: int, block_k: int, interpret: bool, vmem_limit_bytes=None):
  """(out [B, H, Dh, Tq] in q's dtype, lse float32 [B, H, 1, Tq]) from q [B, H, Dh, Tq], k, v
  [B, G, Dh, Tk] (Tq, Tk multiples of the blocks), the packed parameters float32 [flat.size]
  (dape_tile.FlatParams), the side arrays (layout.query_rows, layout.key_info) and each query
  tile's range of key tiles k_lo / k_hi [B * n_q] (tile_ranges.py)."""
  b, h, d, tq = q.shape
  g, tk = k.shape[1], k.shape[3]
  n_q, n_k = tq // block_q, tk // block_k
  kernel = functools.partial(_kernel, tile_bias=tile_bias, flat=flat, scale=scale,
                             causal=causal, n_q_tiles=n_q, n_k_tiles=n_k)
  s = specs(b, h, g, d, n_q, n_k, block_q, block_k, key_outer=False)
  q_out = pl.BlockSpec((None, h, d, block_q), lambda bb, i, j, *_: (bb, 0, 0, i))
  lse_out = pl.BlockSpec((None, h, 1, block_q), lambda bb, i, j, *_: (bb, 0, 0, i))
  return pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2,
          grid=(b, n_q, n_k),
          in_specs=[s[name] for name in ('q', 'k', 'v', 'q_info', 'k_info', 'weights')],
          out_specs=[q_out, lse_out],
          scratch_shapes=[pltpu.VMEM((h, block_q, 1), jnp.float32),
                          pltpu.VMEM((h, block_q, 1), jnp.float32),
                          pltpu.VMEM((h, block_q, d), jnp.float32),
                          *tile_scratch(flat, block_q, block_k, hidden=False)]),
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, 1, tq), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'arbitrary'),
          vmem_limit_bytes=vmem_limit_bytes),
      cost_estimate=dape_cost.forward_cost(b, h, g, tq, tk, d, block_q, block_k, causal,
                                           q.dtype.itemsize, flat, k_lo.size, tile_bias.kind),
      interpret=interpret,
  )(k_lo, k_hi, q, k, v, q_info, k_info, flat_params)
