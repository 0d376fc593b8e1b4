"""`pl.CostEstimate`s of the Pallas TPU kernels, so that XLA's cost model (cost_analysis: flops,
transcendentals, bytes accessed, optimal_seconds; compile/step_cost.py) counts them: XLA cannot
look inside a custom call and costs one without an estimate as nothing.

The estimate is static: it assumes the training case, queries the last Tq positions of the Tk
keys (Tq = Tk, both 0..T-1), causal or not, no document mask, no padding and no FoX pruning.
Document masks, padding and pruning skip more tiles at run time (tile_ranges.py), which a static
estimate cannot know: then it is an upper bound.

FLOPs, over the tiles the kernel computes (`visible_tiles`; 2 FLOPs per multiply-add):
  forward   q k^T, p v                              4 bq bk Dh per tile,  exp bq bk
  dQ        q k^T, dO v^T, dS k                     6 bq bk Dh per tile,  exp bq bk
  dK / dV   q k^T, dO v^T, p^T dO, dS^T q           8 bq bk Dh per tile,  exp bq bk
Bytes: what the kernels' pipelines copy between HBM and VMEM. A block is copied when its block
index differs from the previous grid step's (the index maps clamp skipped steps onto a block
already loaded: tile_ranges.py), and an output block is written back once per consecutive run
of its index. Each copy moves the block as TPU memory lays it out, its last two axes in
(8 x 4 / itemsize, 128) tiles (`tiled_bytes`): the side arrays [B, 8, T] int32 move 32 bytes
per token, the [.., 1, T] float32 rows (log-sum-exp, delta, FoX's positions) 8 sublanes.
The scalar-prefetch range arrays are counted once.
"""

import math
from typing import Callable, Optional

import numpy as np
from jax.experimental import pallas as pl

from bipe_jax.attention.pallas import layout

INT32 = FLOAT32 = 4


def tiled_bytes(block_shape, itemsize: int) -> int:
  """Bytes of one block [..., S, L] in TPU memory: S rounded up to the sublane tile
  (8 rows of 32 bits: 8 for float32, 16 for bfloat16), L to 128 lanes."""
  *lead, s, l = (1, *block_shape) if len(block_shape) == 1 else block_shape
  sublanes = 8 * max(1, 4 // itemsize)
  return (math.prod(lead) * (-(-s // sublanes) * sublanes) * (-(-l // 128) * 128)
          * itemsize)


def visible_tiles(tq: int, tk: int, block_q: int, block_k: int, causal: bool) -> int:
  """Tiles (query tile i, key tile j) of one (row, head) the kernel computes: all of them, or
  with causality those whose first key position is at most the tile's last query position
  (query t at key position Tk - Tq + t)."""
  lo, hi = key_ranges(tq, tk, block_q, block_k, causal)
  return int(np.sum(np.maximum(0, hi - lo + 1)))


def key_ranges(tq: int, tk: int, block_q: int, block_k: int, causal: bool):
  """(lo, hi) int arrays [n_q]: each query tile's first and last computed key tile."""
  n_q, n_k = tq // block_q, tk // block_k
  last = np.full(n_q, n_k - 1)
  if causal:
    last_query = tk - tq + (np.arange(n_q) + 1) * block_q - 1
    last = np.clip(last_query // block_k, -1, n_k - 1)
  return np.zeros(n_q, int), last


def query_ranges(tq: int, tk: int, block_q: int, block_k: int, causal: bool):
  """(lo, hi) int arrays [n_k]: each key tile's first and last computed query tile."""
  lo, hi = key_ranges(tq, tk, block_q, block_k, causal)
  j = np.arange(tk // block_k)
  needed = (j[None, :] >= lo[:, None]) & (j[None, :] <= hi[:, None])  # [n_q, n_k]
  return np.argmax(needed, axis=0), needed.shape[0] - 1 - np.argmax(needed[::-1], axis=0)


def block_copies(outer: tuple, key_of: Callable, ranges: Optional[tuple] = None) -> int:
  """How often an operand's block is copied on a grid of the axes `outer` plus one innermost
  axis. key_of(t) -> [N, k]: the block index's part read from the outer indices (t [N, m], the
  outer index tuples in grid order); `ranges` = (row axis, lo [n], hi [n]): the rest of the
  block index is the inner index clamped into [lo, hi] of the row t[row axis] (None: the
  inner axis does not move the block)."""
  t = np.indices(outer).reshape(len(outer), -1).T
  keys = np.asarray(key_of(t)).reshape(len(t), -1)
  same = np.all(keys[1:] == keys[:-1], axis=1)  # no outer change of the block index
  if ranges is None:
    return int(len(t) - np.sum(same))
  axis, lo, hi = ranges
  lo, hi = np.asarray(lo)[t[:, axis]], np.asarray(hi)[t[:, axis]]
  return int(np.sum(hi - lo + 1) - np.sum(same & (lo[1:] == hi[:-1])))


def _bytes(copies: list) -> int:
  """Sum of copies x tiled bytes over [(count, block_shape, itemsize)]."""
  return sum(n * tiled_bytes(shape, itemsize) for n, shape, itemsize in copies)


def forward_cost(b: int, h: int, g: int, tq: int, tk: int, d: int, block_q: int, block_k: int,
                 causal: bool, itemsize: int, num_params: int = 1,
                 float_positions: bool = False, range_rows: int = 0) -> pl.CostEstimate:
  """The forward kernel's estimate (q [b, h, Dh, tq], k / v [b, g, Dh, tk], forward.py's grid
  (B, H, query tiles, key tiles)); `range_rows`: the length of each range array."""
  tiles, flops, exps = _tile_flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, 2)
  r, n_q = h // g, tq // block_q
  outer, keys = (b, h, n_q), key_ranges(tq, tk, block_q, block_k, causal)
  per_query = block_copies(outer, lambda t: t)  # (b, h, i): q, out, lse, c_q
  clamped = lambda key_of: block_copies(outer, key_of, (2, *keys))
  copies = [(per_query, (d, block_q), itemsize), (per_query, (d, block_q), itemsize),  # q, out
            (per_query, (1, block_q), FLOAT32),  # lse
            (2 * clamped(lambda t: np.stack([t[:, 0], t[:, 1] // r], 1)), (d, block_k),
             itemsize),  # k, v
            (block_copies(outer, lambda t: t[:, [0, 2]]), (layout.INFO, block_q), INT32),
            (clamped(lambda t: t[:, 0]), (layout.INFO, block_k), INT32),
            (block_copies(outer, lambda t: t[:, 1]), (1, num_params), FLOAT32)]
  if float_positions:
    copies += [(per_query, (1, block_q), FLOAT32),
               (clamped(lambda t: t[:, :2]), (1, block_k), FLOAT32)]
  return pl.CostEstimate(flops=flops, transcendentals=exps + b * h * tq,
                         bytes_accessed=_bytes(copies) + 2 * range_rows * INT32)


def backward_cost(b: int, h: int, g: int, tq: int, tk: int, d: int, block_q: int, block_k: int,
                  causal: bool, itemsize: int, num_params: int = 1,
                  float_positions: bool = False,
                  range_rows: int = 0) -> tuple[pl.CostEstimate, pl.CostEstimate]:
  """(dQ kernel, dK / dV kernel) estimates; shapes as `forward_cost` (backward.py's grids:
  dQ (B, H, query tiles, key tiles), dK / dV (B, G, key tiles, H / G, query tiles))."""
  _, dq_flops, exps = _tile_flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, 3)
  _, dkv_flops, _ = _tile_flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, 4)
  r, n_q, n_k = h // g, tq // block_q, tk // block_k
  ranges = 2 * range_rows * INT32

  outer, keys = (b, h, n_q), key_ranges(tq, tk, block_q, block_k, causal)
  per_query = block_copies(outer, lambda t: t)
  clamped = lambda key_of: block_copies(outer, key_of, (2, *keys))
  dq = [(3 * per_query, (d, block_q), itemsize),  # q, dO in; dq out
        (2 * per_query, (1, block_q), FLOAT32),  # lse, delta
        (2 * clamped(lambda t: np.stack([t[:, 0], t[:, 1] // r], 1)), (d, block_k), itemsize),
        (block_copies(outer, lambda t: t[:, [0, 2]]), (layout.INFO, block_q), INT32),
        (clamped(lambda t: t[:, 0]), (layout.INFO, block_k), INT32),
        (block_copies(outer, lambda t: t[:, 1]), (1, num_params), FLOAT32),
        (per_query, (1, num_params), FLOAT32)]  # the parameters' gradient per query tile
  if float_positions:
    dq += [(2 * per_query, (1, block_q), FLOAT32),  # c_q in, d c_q out
           (clamped(lambda t: t[:, :2]), (1, block_k), FLOAT32)]

  outer, queries = (b, g, n_k, r), query_ranges(tq, tk, block_q, block_k, causal)
  head = lambda t: t[:, 1] * r + t[:, 3]
  clamped = lambda key_of: block_copies(outer, key_of, (2, *queries))
  per_key = block_copies(outer, lambda t: t[:, :3])  # (b, g, j): k, v in, dk, dv out
  per_key_head = block_copies(outer, lambda t: np.stack([t[:, 0], head(t), t[:, 2]], 1))
  q_side = clamped(lambda t: np.stack([t[:, 0], head(t)], 1))
  dkv = [(4 * per_key, (d, block_k), itemsize),
         (2 * q_side, (d, block_q), itemsize),  # q, dO
         (2 * q_side, (1, block_q), FLOAT32),  # lse, delta
         (clamped(lambda t: t[:, 0]), (layout.INFO, block_q), INT32),
         (block_copies(outer, lambda t: t[:, [0, 2]]), (layout.INFO, block_k), INT32),
         (block_copies(outer, head), (1, num_params), FLOAT32)]
  if float_positions:
    dkv += [(q_side, (1, block_q), FLOAT32),  # c_q
            (2 * per_key_head, (1, block_k), FLOAT32)]  # c_k in, d c_k out
  return (pl.CostEstimate(flops=dq_flops, transcendentals=exps,
                          bytes_accessed=_bytes(dq) + ranges),
          pl.CostEstimate(flops=dkv_flops, transcendentals=exps,
                          bytes_accessed=_bytes(dkv) + ranges))


def _tile_flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, matmuls):
  tiles = b * h * visible_tiles(tq, tk, block_q, block_k, causal)
  return tiles, tiles * 2 * matmuls * block_q * block_k * d, tiles * block_q * block_k
