"""`pl.CostEstimate`s of the Pallas kernels, so that XLA's cost model (cost_analysis: flops,
transcendentals, bytes accessed, optimal_seconds; compile/step_cost.py) counts them: XLA cannot
look inside a custom call and costs one without an estimate as nothing.

Counted per (row, query head) over the tiles the kernel computes: `visible_tiles` assumes the
queries are the last Tq positions of the Tk keys (training: Tq = Tk, both 0..T-1), so a causal
kernel computes the tiles on and below the diagonal; document masks and padding skip more at
run time, which a static estimate cannot know. Matmuls are 2 FLOPs per multiply-add:
  forward   q k^T, p v                              4 bq bk Dh per tile,  exp bq bk
  dQ        q k^T, dO v^T, dS k                     6 bq bk Dh per tile,  exp bq bk
  dK / dV   q k^T, dO v^T, p^T dO, dS^T q           8 bq bk Dh per tile,  exp bq bk
Bytes: each operand block as the grid reads it (the blocks a computed tile reads again for every
tile; the ones a grid row keeps, once per row) and each output once.
"""

from jax.experimental import pallas as pl


def visible_tiles(tq: int, tk: int, block_q: int, block_k: int, causal: bool) -> int:
  """Tiles (query tile i, key tile j) of one (row, head) the kernel computes: all of them, or
  with causality those whose first key position is at most the tile's last query position
  (query t at key position Tk - Tq + t)."""
  n_q, n_k = tq // block_q, tk // block_k
  if not causal:
    return n_q * n_k
  offset = tk - tq
  return sum(min(n_k, max(0, (offset + (i + 1) * block_q - 1) // block_k + 1))
             for i in range(n_q))


def _tile_flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, matmuls):
  tiles = b * h * visible_tiles(tq, tk, block_q, block_k, causal)
  return tiles, tiles * 2 * matmuls * block_q * block_k * d, tiles * block_q * block_k


def forward_cost(b: int, h: int, tq: int, tk: int, d: int, block_q: int, block_k: int,
                 causal: bool, itemsize: int) -> pl.CostEstimate:
  """The forward kernel's estimate (q [b, h, tq, d], k / v [b, G, tk, d])."""
  tiles, flops, exps = _tile_flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, 2)
  q_and_out = 2 * b * h * tq * d * itemsize
  kv_reads = tiles * 2 * block_k * d * itemsize
  lse = b * h * tq * 4
  return pl.CostEstimate(flops=flops, transcendentals=exps + b * h * tq,
                         bytes_accessed=q_and_out + kv_reads + lse)


def backward_cost(b: int, h: int, g: int, tq: int, tk: int, d: int, block_q: int, block_k: int,
                  causal: bool, itemsize: int) -> tuple[pl.CostEstimate, pl.CostEstimate]:
  """(dQ kernel, dK / dV kernel) estimates; shapes as `forward_cost`, g KV heads."""
  tiles, dq_flops, exps = _tile_flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, 3)
  _, dkv_flops, _ = _tile_flops_and_exps(b, h, tq, tk, d, block_q, block_k, causal, 4)
  rows = b * h * tq * (2 * d * itemsize + 2 * 4)  # q, dO and the lse / delta rows
  dq = pl.CostEstimate(
      flops=dq_flops, transcendentals=exps,
      bytes_accessed=rows + tiles * 2 * block_k * d * itemsize + b * h * tq * d * itemsize)
  keys = b * g * tk * 4 * d * itemsize  # k, v read and dk, dv written, once per key tile
  per_tile = tiles * (block_q * (2 * d * itemsize + 2 * 4))  # q, dO, lse, delta per tile
  dkv = pl.CostEstimate(flops=dkv_flops, transcendentals=exps, bytes_accessed=keys + per_tile)
  return dq, dkv
