"""Which tiles the TPU kernels compute and fetch: per row of tiles, the first and last tile it
needs, from the masks' side info (scalar prefetch of the kernels' grids).

A tile (query tile i, key tile j) of one (batch row, head) is needed unless it provably holds no
visible pair, or FoX's pruning drops it:
  causal     the smallest causal index of j's valid keys exceeds the largest of i's queries;
  documents  the document ids of i's real queries and j's valid keys span disjoint ranges;
  padding    i has no real query (padded rows) or j no valid key;
  FoX        (with a pruning threshold) max_i c_q - min_j c_k < threshold, per head: every
             weight of the tile is below exp(log tolerance) (encodings/fox.py's bound).
`tile_ranges` gives, for each query tile, the first and last needed key tile (`k_lo`, `k_hi`,
for the forward and dQ kernels) and for each key tile the first and last needed query tile
(`q_lo`, `q_hi`, for the dK / dV kernel). A kernel computes step j of a row only when
lo <= j <= hi, and its index maps fetch block `fetch_index(j, lo, hi)`: j clamped into
[lo, hi], so the steps before the range repeat block lo (fetched once, for the first needed
tile) and those after it repeat block hi (already loaded): the pipeline copies a block only
when its index changes between consecutive steps. A row that needs nothing stores
lo = p + 1, hi = p with p the previous row's last block (0 for the first row): it computes
nothing and fetches nothing new.

For causal rows of packed documents (document ids that never decrease) the needed key tiles of
a query tile are contiguous, so the range is exact; otherwise tiles inside the range may still
be computed (their pairs are masked per element, so results are unchanged).

Arrays are int32, flattened [B * Hr * n] (n tiles per row); Hr = H when FoX prunes (the bound is
per head), else 1 (`row_of` picks the row).
"""

import dataclasses

import jax
import jax.numpy as jnp

from bipe_jax.attention.pallas import layout

_I32 = jnp.iinfo(jnp.int32)


@dataclasses.dataclass(frozen=True)
class TileRanges:
  """k_lo, k_hi [B * Hr * n_q]; q_lo, q_hi [B * Hr * n_k] int32; per_head: Hr = H (static)."""
  k_lo: jax.Array
  k_hi: jax.Array
  q_lo: jax.Array
  q_hi: jax.Array
  per_head: bool


def row_of(b, h, i, n: int, num_heads: int, per_head: bool):
  """Index into a flattened [B * Hr * n] range array of tile row i of (batch b, head h)."""
  return ((b * num_heads + h) * n + i) if per_head else (b * n + i)


def fetch_index(j, lo, hi):
  """The block a step fetches: j clamped into [min(lo, hi), hi] (an empty row: block hi)."""
  return jnp.minimum(jnp.maximum(j, jnp.minimum(lo, hi)), hi)


def runs(j, lo, hi):
  """Whether step j of a row with range [lo, hi] is computed."""
  return (lo <= j) & (j <= hi)


def _tiles(x, block: int, axis: int):
  """x [..., T, ...] -> [..., T / block, block, ...] along `axis`."""
  shape = x.shape[:axis] + (x.shape[axis] // block, block) + x.shape[axis + 1:]
  return x.reshape(shape)


def needed_tiles(q_info_BxIxT, k_info_BxIxT, block_q: int, block_k: int, causal: bool,
                 c_q_BxHx1xT=None, c_k_BxHx1xT=None, threshold=None) -> jax.Array:
  """bool [B, Hr, n_q, n_k]: the tiles that may hold a visible (and unpruned) pair, from the
  side arrays (layout.query_rows, layout.key_info); Hr = H with a pruning `threshold` (c_q /
  c_k: FoX's positions, padded like the side arrays), else 1."""
  q_pos = _tiles(q_info_BxIxT[:, layout.POS, :], block_q, 1)  # [B, n_q, bq]
  q_doc = _tiles(q_info_BxIxT[:, layout.DOC, :], block_q, 1)
  k_pos = _tiles(k_info_BxIxT[:, layout.POS, :], block_k, 1)  # [B, n_k, bk]
  k_doc = _tiles(k_info_BxIxT[:, layout.DOC, :], block_k, 1)
  real = q_pos != _I32.min
  valid = k_info_BxIxT[:, layout.VALID, :].reshape(k_pos.shape) != 0
  lowest = lambda x, keep: jnp.min(jnp.where(keep, x, _I32.max), axis=-1)
  highest = lambda x, keep: jnp.max(jnp.where(keep, x, _I32.min), axis=-1)
  needed = (jnp.any(real, -1)[:, :, None] & jnp.any(valid, -1)[:, None, :]
            & (lowest(q_doc, real)[:, :, None] <= highest(k_doc, valid)[:, None, :])
            & (lowest(k_doc, valid)[:, None, :] <= highest(q_doc, real)[:, :, None]))
  if causal:
    needed = needed & (lowest(k_pos, valid)[:, None, :] <= highest(q_pos, real)[:, :, None])
  needed = needed[:, None]
  if threshold is not None:
    b, h = c_q_BxHx1xT.shape[:2]
    c_q = _tiles(c_q_BxHx1xT[:, :, 0, :], block_q, 2)  # [B, H, n_q, bq]
    c_k = _tiles(c_k_BxHx1xT[:, :, 0, :], block_k, 2)
    top = jnp.max(jnp.where(real[:, None], c_q, -jnp.inf), axis=-1)  # [B, H, n_q]
    bottom = jnp.min(jnp.where(valid[:, None], c_k, jnp.inf), axis=-1)  # [B, H, n_k]
    bound = jax.lax.stop_gradient(top[..., :, None] - bottom[..., None, :])
    needed = needed & (bound >= jax.lax.stop_gradient(threshold))
  return needed


def _row_ranges(needed_BxHxRxC):
  """(lo, hi) int32 [B, H, R]: each row's first and last needed column (module docstring for
  rows that need nothing)."""
  n_rows, n_cols = needed_BxHxRxC.shape[-2:]
  any_needed = jnp.any(needed_BxHxRxC, axis=-1)
  first = jnp.argmax(needed_BxHxRxC, axis=-1).astype(jnp.int32)
  last = (n_cols - 1 - jnp.argmax(needed_BxHxRxC[..., ::-1], axis=-1)).astype(jnp.int32)
  rows = jnp.arange(n_rows, dtype=jnp.int32)
  # the last row at or before each row that needs something (-1: none yet)
  before = jax.lax.cummax(jnp.where(any_needed, rows, -1), axis=needed_BxHxRxC.ndim - 2)
  prev_end = jnp.where(before >= 0, jnp.take_along_axis(last, jnp.maximum(before, 0), axis=-1),
                       0)
  lo = jnp.where(any_needed, first, prev_end + 1)
  hi = jnp.where(any_needed, last, prev_end)
  return lo, hi


def tile_ranges(q_info_BxIxT, k_info_BxIxT, block_q: int, block_k: int, causal: bool,
                c_q_BxHx1xT=None, c_k_BxHx1xT=None, threshold=None) -> TileRanges:
  """The kernels' scalar-prefetch ranges (module docstring); arguments as `needed_tiles`."""
  needed = needed_tiles(q_info_BxIxT, k_info_BxIxT, block_q, block_k, causal, c_q_BxHx1xT,
                        c_k_BxHx1xT, threshold)
  k_lo, k_hi = _row_ranges(needed)
  q_lo, q_hi = _row_ranges(jnp.swapaxes(needed, -1, -2))
  flat = lambda x: x.reshape(-1)
  return TileRanges(flat(k_lo), flat(k_hi), flat(q_lo), flat(q_hi),
                    per_head=threshold is not None)
