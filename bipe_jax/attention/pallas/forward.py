"""The forward Pallas kernel: online-softmax attention with the bias computed per tile.

Grid (B, H, query tiles, key tiles), key tiles innermost ("arbitrary"): the running max `m`,
normaliser `l` and weighted sum live in VMEM scratch across the key tiles of one query tile.
Only the key tiles a query tile needs are computed or fetched (scalar prefetch of
`tile_ranges.tile_ranges`: per query tile the first and last key tile that may hold a visible,
unpruned pair): the index maps clamp the key tile into that range, so a skipped step repeats the
block index of one already loaded and the pipeline copies nothing (tiles above the diagonal,
across documents, all padding, or pruned by FoX). Outputs the attention and the per-row
log-sum-exp [B, H, 1, Tq] (0 for a row that sees no key), the only residual the backward needs;
it is stored as a row because a [.., Tq, 1] array is padded to 128 lanes in TPU memory.
GQA: query head h reads KV head h // (H / G).

Layout: q, k, v and the output are [B, H, Dh, T], the head dimension in sublanes and the tokens
in lanes. TPU memory tiles an array's last two axes by (8, 128), so [.., T, Dh] with Dh = 64
would take twice its bytes in HBM (the lanes padded to 128) for every array the kernels read or
write, and the custom call fixes that layout; [.., Dh, T] is never padded (Dh a multiple of 8).
The products take the transposes through their contraction axes (`_TRANS_A`, `_TRANS_B`).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bipe_jax.kernels.gqa_products import NEG_INF
from bipe_jax.attention.pallas import cost
from bipe_jax.attention.pallas import layout
from bipe_jax.attention.pallas import tile_ranges
from bipe_jax.attention.pallas.tile_bias import TileBias

_TRANS_A = (((0,), (0,)), ((), ()))  # contract the first axis of both operands
_TRANS_B = (((1,), (1,)), ((), ()))  # contract the last axis of both operands


def split_float_positions(tile_bias: TileBias, refs):
  """((c_q_ref [1, q], c_k_ref [1, k]) or None, the remaining refs): the kernels take FoX's
  float position rows right after params_ref, only for a bias that uses them."""
  if tile_bias.uses_float_positions:
    return tuple(refs[:2]), refs[2:]
  return None, refs


def tile_logits(q_ref, k_ref, qi_ref, ki_ref, params_ref, c_refs=None, *, tile_bias: TileBias,
                scale: float, causal: bool):
  """(masked logits float32 [q, k], visible bool [q, k]) of one (query tile, key tile, head);
  q_ref [Dh, q], k_ref [Dh, k]."""
  s = jax.lax.dot_general(q_ref[...], k_ref[...], _TRANS_A,
                          preferred_element_type=jnp.float32) * scale
  qi, ki = layout.query_columns(qi_ref[...]), ki_ref[...]
  c = () if c_refs is None else (layout.row_to_column(c_refs[0][...]), c_refs[1][...])
  bias = tile_bias.bias(params_ref[...], *layout.streams(qi, ki), *c)
  if bias is not None:
    s = s + bias
  vis = layout.visible(qi, ki, causal)
  return jnp.where(vis, s, NEG_INF), vis


def zero(*refs) -> None:
  """Sets float32 scratch refs to zero (the start of an accumulation)."""
  for ref in refs:
    ref[...] = jnp.zeros(ref.shape, jnp.float32)


@dataclasses.dataclass(frozen=True)
class Rows:
  """How a kernel reads its pair of range arrays (tile_ranges.py): `n` tiles per row of
  tiles, `num_heads` query heads, `per_head` (the arrays hold a row per head)."""
  n: int
  num_heads: int
  per_head: bool

  def row(self, b, h, i):
    return tile_ranges.row_of(b, h, i, self.n, self.num_heads, self.per_head)

  def fetch(self, lo_ref, hi_ref, b, h, i, step):
    """The block step `step` of row i of (b, h) fetches (clamped into the row's range)."""
    r = self.row(b, h, i)
    return tile_ranges.fetch_index(step, lo_ref[r], hi_ref[r])


def should_run(lo_ref, hi_ref, rows: Rows, b, h, i, step):
  """Whether step `step` of row i of (b, h) is inside the row's range of needed tiles."""
  r = rows.row(b, h, i)
  return tile_ranges.runs(step, lo_ref[r], hi_ref[r])


def _forward_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, qi_ref, ki_ref, params_ref,
                    *refs, tile_bias, scale, causal, n_k_tiles, rows):
  c_refs, (o_ref, lse_ref, m_scr, l_scr, acc_scr) = split_float_positions(tile_bias, refs)
  b, h, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    m_scr[...] = jnp.full(m_scr.shape, NEG_INF, jnp.float32)
    zero(l_scr, acc_scr)

  @pl.when(should_run(lo_ref, hi_ref, rows, b, h, i, j))
  def _compute():
    s, vis = tile_logits(q_ref, k_ref, qi_ref, ki_ref, params_ref, c_refs, tile_bias=tile_bias,
                         scale=scale, causal=causal)
    m_prev = m_scr[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    p = jnp.where(vis, jnp.exp(s - m_new), 0.0)
    corr = jnp.exp(m_prev - m_new)
    l_scr[...] = corr * l_scr[...] + jnp.sum(p, axis=1, keepdims=True)
    v = v_ref[...]  # [Dh, k]
    acc_scr[...] = corr * acc_scr[...] + jax.lax.dot_general(
        p.astype(v.dtype), v, _TRANS_B, preferred_element_type=jnp.float32)
    m_scr[...] = m_new

  @pl.when(j == n_k_tiles - 1)
  def _finish():
    l = l_scr[...]
    seen = l > 0.0
    o_ref[...] = (acc_scr[...] / jnp.where(seen, l, 1.0)).T.astype(o_ref.dtype)  # [Dh, q]
    lse = jnp.where(seen, m_scr[...] + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
    lse_ref[...] = layout.column_to_row(lse)


def side_specs(block_q: int, block_k: int, num_params: int, tile_of, float_positions=False):
  """BlockSpecs of q_info, k_info and the [H, 1, P] params (and, with `float_positions`, of
  the c rows [B, H, 1, Tq] / [B, H, 1, Tk]); `tile_of(*grid_indices)` gives the
  (batch, query tile, key tile, head) a grid step reads."""
  pick = lambda *idx: lambda *a: tuple(tile_of(*a)[n] if isinstance(n, int) and n >= 0 else 0
                                       for n in idx)
  specs = [pl.BlockSpec((None, layout.INFO, block_q), pick(0, -1, 1)),
           pl.BlockSpec((None, layout.INFO, block_k), pick(0, -1, 2)),
           pl.BlockSpec((None, 1, num_params), pick(3, -1, -1))]
  if float_positions:
    specs += [pl.BlockSpec((None, None, 1, block_q), pick(0, 3, -1, 1)),
              pl.BlockSpec((None, None, 1, block_k), pick(0, 3, -1, 2))]
  return specs


def float_position_args(tile_bias: TileBias, c_q, c_k) -> tuple:
  """(c_q, c_k) float32 rows for a bias that uses them, else ()."""
  if not tile_bias.uses_float_positions:
    return ()
  return c_q.astype(jnp.float32), c_k.astype(jnp.float32)


def forward_specs(b, h, g, d, n_q, n_k, block_q, block_k, num_params, float_positions,
                  rows: Rows):
  """(grid, in_specs, out_specs) of the forward call: grid (B, H, query tiles, key tiles); the
  key-side blocks (k, v, k_info, c_k) clamped into each query tile's range of key tiles."""
  r = h // g

  def tile_of(bb, hh, i, j, lo_ref, hi_ref):  # (batch, query tile, key tile, head)
    return bb, i, rows.fetch(lo_ref, hi_ref, bb, hh, i, j), hh

  q_spec = pl.BlockSpec((None, None, d, block_q), lambda bb, hh, i, j, *_: (bb, hh, 0, i))
  kv_spec = pl.BlockSpec((None, None, d, block_k),
                         lambda *a: (a[0], jax.lax.div(a[1], r), 0, tile_of(*a)[2]))
  sides = side_specs(block_q, block_k, num_params, tile_of, float_positions)
  lse_spec = pl.BlockSpec((None, None, 1, block_q), lambda bb, hh, i, j, *_: (bb, hh, 0, i))
  return (b, h, n_q, n_k), [q_spec, kv_spec, kv_spec, *sides], [q_spec, lse_spec]


def forward(q, k, v, params_HxP, q_info, k_info, k_lo, k_hi, c_q=None, c_k=None, *,
            tile_bias: TileBias, scale: float, causal: bool, block_q: int, block_k: int,
            per_head: bool, interpret: bool):
  """(out [B, H, Dh, Tq] in q's dtype, lse float32 [B, H, 1, Tq]) from q [B, H, Dh, Tq] and
  k, v [B, G, Dh, Tk] (the module's layout); Tq, Tk multiples of the blocks (pad first:
  bipe_jax.attention.pallas.layout); k_lo / k_hi: each query tile's range of key tiles
  (tile_ranges.py; a row per head when `per_head`); c_q / c_k [B, H, 1, Tq / Tk]: FoX's
  positions."""
  b, h, d, tq = q.shape
  g, tk = k.shape[1], k.shape[3]
  n_q, n_k = tq // block_q, tk // block_k
  params = params_HxP.astype(jnp.float32)[:, None, :]
  rows = Rows(n_q, h, per_head)
  kernel = functools.partial(_forward_kernel, tile_bias=tile_bias, scale=scale, causal=causal,
                             n_k_tiles=n_k, rows=rows)
  grid, in_specs, out_specs = forward_specs(b, h, g, d, n_q, n_k, block_q, block_k,
                                            params.shape[-1], tile_bias.uses_float_positions,
                                            rows)
  return pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2,
          grid=grid,
          in_specs=in_specs,
          out_specs=out_specs,
          scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32),
                          pltpu.VMEM((block_q, 1), jnp.float32),
                          pltpu.VMEM((block_q, d), jnp.float32)]),
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, 1, tq), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'parallel', 'arbitrary')),
      cost_estimate=cost.forward_cost(b, h, g, tq, tk, d, block_q, block_k, causal,
                                      q.dtype.itemsize, params.shape[-1],
                                      tile_bias.uses_float_positions, k_lo.size),
      interpret=interpret,
  )(k_lo, k_hi, q, k, v, q_info, k_info, params, *float_position_args(tile_bias, c_q, c_k))
