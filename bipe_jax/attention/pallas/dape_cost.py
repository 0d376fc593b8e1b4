"""`pl.CostEstimate`s of the fused DAPE V1 kernels (dape_forward.py, dape_backward.py), counted
as cost.py counts the bias kernels': the static training case (Tq = Tk, causal or not, no
documents, no padding), FLOPs over the computed tiles, bytes over the blocks the pipelines copy
(a block is copied when its index changes; the clamped index maps repeat a loaded block on the
skipped steps), in TPU memory's (8, 128) tiling.

FLOPs per computed tile (bq x bk pairs, H heads, C features, N hidden units, 2 per
multiply-add):
  forward   per head q k^T, p v: 4 bq bk Dh;   the MLP: 2 (C N + N H) bq bk
  dQ        per head q k^T, dO v^T, dS k: 6 bq bk Dh;   the MLP forward, backward and the
            parameters' gradient products: 6 (C N + N H) bq bk
  dK / dV   per head q k^T, dO v^T, p^T dO, dS^T q: 8 bq bk Dh;   the MLP forward and backward:
            4 (C N + N H) bq bk
Transcendentals: an exp per head and pair, and Kerple's log1p per head and pair.
Caveat: the MLP's FLOPs run on the vector unit (dape_tile.py), much slower than the MXU (not
measured here), while XLA's cost model prices every FLOP alike: with H = 12, N = 32, Dh = 64
the MLP is about 43 % of the forward's and dK / dV's FLOPs and 60 % of dQ's, so a time
predicted from these estimates is a lower bound, not a forecast.
"""

from jax.experimental import pallas as pl

from bipe_jax.attention.pallas import cost
from bipe_jax.attention.pallas import layout

INT32 = FLOAT32 = 4


def _tiles(b, tq, tk, block_q, block_k, causal) -> int:
  return b * cost.visible_tiles(tq, tk, block_q, block_k, causal)


def _flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, flat, matmuls, mlp_passes,
                    tile_bias_kind):
  tiles = _tiles(b, tq, tk, block_q, block_k, causal)
  pairs = tiles * block_q * block_k
  mlp = flat.features * flat.hidden + flat.hidden * flat.heads
  flops = pairs * (2 * matmuls * h * d + 2 * mlp_passes * mlp)
  exps = pairs * h * (2 if tile_bias_kind == 'kerple' else 1)
  return flops, exps


def forward_cost(b: int, h: int, g: int, tq: int, tk: int, d: int, block_q: int, block_k: int,
                 causal: bool, itemsize: int, flat, range_rows: int = 0,
                 tile_bias_kind: str = 'kerple') -> pl.CostEstimate:
  """The forward kernel's estimate: q [b, h, Dh, tq], k / v [b, g, Dh, tk], grid (B, query
  tiles, key tiles); `flat`: dape_tile.FlatParams; `range_rows`: each range array's length."""
  flops, exps = _flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, flat, 2, 1,
                                tile_bias_kind)
  n_q = tq // block_q
  outer, keys = (b, n_q), cost.key_ranges(tq, tk, block_q, block_k, causal)
  per_query = cost.block_copies(outer, lambda t: t)
  key_side = cost.block_copies(outer, lambda t: t[:, 0], (1, *keys))
  copies = [(2 * per_query, (h, d, block_q), itemsize),  # q in, out
            (per_query, (h, 1, block_q), FLOAT32),  # lse
            (2 * key_side, (g, d, block_k), itemsize),  # k, v
            (per_query, (layout.INFO, block_q), INT32),
            (key_side, (layout.INFO, block_k), INT32)]
  fixed = flat.size * FLOAT32 + 2 * range_rows * INT32  # SMEM parameters, the ranges
  return pl.CostEstimate(flops=flops, transcendentals=exps + b * h * tq,
                         bytes_accessed=_bytes(copies) + fixed)


def backward_cost(b: int, h: int, g: int, tq: int, tk: int, d: int, block_q: int, block_k: int,
                  causal: bool, itemsize: int, flat, range_rows: int = 0,
                  tile_bias_kind: str = 'kerple') -> tuple:
  """(dQ kernel, dK / dV kernel) estimates; shapes as `forward_cost` (grids (B, query tiles,
  key tiles) and (B, key tiles, query tiles))."""
  dq_flops, exps = _flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, flat, 3, 3,
                                   tile_bias_kind)
  dkv_flops, _ = _flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, flat, 4, 2,
                                 tile_bias_kind)
  n_q, n_k = tq // block_q, tk // block_k
  fixed = flat.size * FLOAT32 + 2 * range_rows * INT32

  outer, keys = (b, n_q), cost.key_ranges(tq, tk, block_q, block_k, causal)
  per_query = cost.block_copies(outer, lambda t: t)
  key_side = cost.block_copies(outer, lambda t: t[:, 0], (1, *keys))
  dq = [(3 * per_query, (h, d, block_q), itemsize),  # q, dO in; dq out
        (2 * per_query, (h, 1, block_q), FLOAT32),  # lse, delta
        (2 * key_side, (g, d, block_k), itemsize),  # k, v
        (per_query, (layout.INFO, block_q), INT32),
        (key_side, (layout.INFO, block_k), INT32),
        (b, (flat.hidden + 1, flat.grad_rows, block_k), FLOAT32)]  # gradient rows, once per row

  outer, queries = (b, n_k), cost.query_ranges(tq, tk, block_q, block_k, causal)
  per_key = cost.block_copies(outer, lambda t: t)
  query_side = cost.block_copies(outer, lambda t: t[:, 0], (1, *queries))
  dkv = [(4 * per_key, (g, d, block_k), itemsize),  # k, v in; dk, dv out
         (2 * query_side, (h, d, block_q), itemsize),  # q, dO
         (2 * query_side, (h, 1, block_q), FLOAT32),  # lse, delta
         (query_side, (layout.INFO, block_q), INT32),
         (per_key, (layout.INFO, block_k), INT32)]
  return (pl.CostEstimate(flops=dq_flops, transcendentals=exps,
                          bytes_accessed=_bytes(dq) + fixed),
          pl.CostEstimate(flops=dkv_flops, transcendentals=exps,
                          bytes_accessed=_bytes(dkv) + fixed))


def _bytes(copies: list) -> int:
  return sum(n * cost.tiled_bytes(shape, itemsize) for n, shape, itemsize in copies)
