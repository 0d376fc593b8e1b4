"""A causal positional bias made two-sided, for the encoder mode (`model.causal=False`).

Every bias of the project is a function of the clamped distance max(q - k, 0) (ALiBi, Kerple,
FIRE, T5 with causal buckets): without the causal mask, all future keys would get the bias of
distance 0. The encoder bias applies the same function, with the same parameters, to the mirrored
distance on the right, half a position further away:

  bias2(q, k) = bias(q, k)                  for k <= q   (past keys and the query itself)
              = bias(-q, -k - 1/2)          for k >  q   (= f(k - q + 1/2) for a bias f(q - k))

The half step breaks the left/right symmetry, as the benchmark's encoder ALiBi does (Ruoss et
al. 2023 add 0.5 * slope to the lower triangle: for ALiBi the two are equal up to a per-row
constant, which the softmax ignores). T5 buckets are integer: there the right side is f(k - q).
FIRE's normaliser psi(max(L, q)) reads the query position: on the right it is psi(L).
"""

from typing import Callable

import jax
import jax.numpy as jnp


def two_sided_bias(bias_fn: Callable[[jax.Array, jax.Array], jax.Array]) -> Callable:
  """bias_fn(q_streams [B, Q], k_streams [B, K]) -> [B or 1, H, Q, K], made two-sided."""

  def bias(q_BxQ: jax.Array, k_BxK: jax.Array) -> jax.Array:
    left = bias_fn(q_BxQ, k_BxK)
    q_f, k_f = q_BxQ.astype(jnp.float32), k_BxK.astype(jnp.float32)
    right = bias_fn(-q_f, -k_f - 0.5)
    past_Bx1xQxK = k_BxK[:, None, None, :] <= q_BxQ[:, None, :, None]
    return jnp.where(past_Bx1xQxK, left, right)

  return bias
