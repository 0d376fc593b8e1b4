"""The two matmuls of grouped-query attention in the [B, H, T, Dh] layout, shared by every
attention implementation (bipe_jax.attention) and the CPU path's hand-written backward
(kernels/cpu_attention.py).

GQA: keys / values have G heads, G divides H; query head h reads KV head h // (H // G) (the
Hugging Face `repeat_kv` order). The R = H / G query heads of a group are merged into the query
axis, so each product is one 4-D batched matmul (measured ~2x faster forward + backward on XLA
CPU than a 5-D einsum), and no KV head is repeated in memory.
"""

import jax
import jax.numpy as jnp

NEG_INF = -1e30  # finite "minus infinity": keeps exp() and its gradient NaN-free


def attention_scores(q_BxHxQxDh, k_BxGxKxDh, scale: float) -> jax.Array:
  """scale * q.k in float32, [B, H, Q, K], with GQA grouping."""
  b, h, nq, d = q_BxHxQxDh.shape
  g, nk = k_BxGxKxDh.shape[1], k_BxGxKxDh.shape[2]
  q4 = (q_BxHxQxDh * jnp.asarray(scale, q_BxHxQxDh.dtype)).reshape(b, g, (h // g) * nq, d)
  s = jnp.einsum('bgxd,bgkd->bgxk', q4, k_BxGxKxDh, preferred_element_type=jnp.float32)
  return s.reshape(b, h, nq, nk)


def weighted_values(p_BxHxQxK, v_BxGxKxDh) -> jax.Array:
  """p @ v with GQA grouping: [B, H, Q, Dh] float32."""
  b, h, nq, nk = p_BxHxQxK.shape
  g, d = v_BxGxKxDh.shape[1], v_BxGxKxDh.shape[3]
  p4 = p_BxHxQxK.reshape(b, g, (h // g) * nq, nk).astype(v_BxGxKxDh.dtype)
  o = jnp.einsum('bgxk,bgkd->bgxd', p4, v_BxGxKxDh, preferred_element_type=jnp.float32)
  return o.reshape(b, h, nq, d)
