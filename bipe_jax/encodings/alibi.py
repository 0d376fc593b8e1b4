"""ALiBi (Press et al. 2022) and BiPE-ALiBi linear biases.

bias[b, h, i, j] = -slope_factor * m_h * max(q_pos[b, i] - k_pos[b, j], 0).

Convention shared by every bias in this package: the distance q - k is clamped at 0, so keys
"after" the query (k > q, which the caller masks in causal attention) get bias 0; no huge
positive values ever appear. BiPE-ALiBi calls it with inter-segment ids and slope_factor=96
(official code), so tokens of the same segment get no bias.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax import input_checks


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Standard ALiBi slopes [H] float32: 2**(-8h/H), h = 1..H for a power-of-two H.

  Otherwise the slopes of the largest power of two n < H, then every other slope of 2n
  (12 heads: 2^-1..2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
  """
  if num_heads <= 0:
    raise ValueError(f'alibi_slopes: num_heads must be positive, got {num_heads}.')

  def power_of_two(n):
    return [2.0**(-8.0 * h / n) for h in range(1, n + 1)]

  n = 2**int(math.floor(math.log2(num_heads)))
  slopes = power_of_two(n)
  if n < num_heads:
    slopes += power_of_two(2 * n)[0::2][:num_heads - n]
  return np.asarray(slopes, dtype=np.float32)


def alibi_bias(q_pos_BxQ: jax.Array, k_pos_BxK: jax.Array, slopes_H,
               slope_factor: float = 1.) -> jax.Array:
  """Linear distance bias [B, H, Q, K] float32 (B of the inputs may be 1 and broadcasts)."""
  input_checks.check_positions('alibi_bias', q_pos_BxQ=q_pos_BxQ, k_pos_BxK=k_pos_BxK)
  input_checks.check_per_head('alibi_bias', slopes_H=slopes_H)
  slopes_H = jnp.asarray(slopes_H, dtype=jnp.float32)
  distance_Bx1xQxK = jnp.maximum(
      q_pos_BxQ[:, None, :, None] - k_pos_BxK[:, None, None, :], 0).astype(jnp.float32)
  return distance_Bx1xQxK * (-slope_factor * slopes_H)[None, :, None, None]


def alibi_key_bias(k_pos_BxK: jax.Array, slopes_H, slope_factor: float = 1.) -> jax.Array:
  """ALiBi as a per-key bias [B, H, 1, K] float32, for fused attention kernels.

  For a visible pair (key at or before the query), -s*m*(p_q - p_k) = -s*m*p_q + s*m*p_k; the
  first term is the same for every key of a query row, and softmax ignores a per-row constant,
  so attention with the bias s*m*p_k equals attention with `alibi_bias`. This needs the clamp of
  `alibi_bias` to be inactive on every visible pair: p_k <= p_q whenever the key is visible.
  It holds for the token and inter streams of a row (both never decrease along the row; padding
  is masked), in training and in decoding, and with documents that restart positions only when
  attention across documents is masked (restart_at_documents without mask_across_documents
  breaks it: a key of an earlier document may have a larger position than the query).
  The logits grow with s*m*p_k (bipe_alibi: s = 96), so use it in float32: in bfloat16 the bias
  of a long row loses its low bits.
  """
  slopes_H = jnp.asarray(slopes_H, dtype=jnp.float32)
  return (k_pos_BxK[:, None, None, :].astype(jnp.float32)
          * (slope_factor * slopes_H)[None, :, None, None])
