"""The CPU path's dense softmax-attention core: a hand-written backward in XLA CPU's fast form.

`softmax_attention(q, k, v, bias, visible)` = softmax(q.k + bias, masked by `visible`) @ v,
float32 [B, H, Q, Dh] (q already scaled). bias: None or float32 [B or 1, H, Q, K]; visible:
bool [B or 1, 1, Q, K]. A row with no visible key gives zeros.

The backward pass is written by hand (FlashAttention's formulas on the stored probabilities)
so that each of its four matmuls has the form XLA CPU runs fast: the two products that contract
the query axis, dV = P^T dO and dK = dS^T Q, are computed as their transposes dO^T P and Q^T dS
(whose left operand contracts its last axis) and handed back transposed
(`_transposed_product`). In isolation that form runs ~1.8x faster than the automatic one (0.77
vs 1.37 ms at [16, 4, 128, 32], one thread); without the barrier XLA kept it for dV but folded
dK back into the slow form. The whole training step: 0.976x with the barrier on dK (tiny
preset, benchmarks/README.md).
"""

import jax
import jax.numpy as jnp

from bipe_jax.kernels.gqa_products import NEG_INF
from bipe_jax.kernels.gqa_products import attention_scores
from bipe_jax.kernels.gqa_products import weighted_values


def _sum_to_shape(x: jax.Array, shape: tuple) -> jax.Array:
  """Sums `x` over the axes where `shape` (same rank) has size 1: the cotangent of a
  broadcast."""
  axes = tuple(i for i, (n, m) in enumerate(zip(x.shape, shape)) if m == 1 and n != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _swap_last(x: jax.Array) -> jax.Array:
  return jnp.swapaxes(x, -1, -2)


def _transposed_product(equation: str, a_t: jax.Array, b: jax.Array) -> jax.Array:
  """einsum(equation, a_t, b) (float32) with its last two axes swapped, where `a_t` is the
  transpose of an array and `equation` contracts a_t's last axis.

  The product is computed in that form (a row-major matmul) and only then transposed.
  Optimization barriers around a_t and the product keep XLA from folding either transpose into
  the matmul, which would turn it back into the slow form that contracts the left operand's
  second-to-last axis (XLA folds the inner one, or the outer one by swapping the operands,
  depending on the surrounding fusions).
  """
  product = jnp.einsum(equation, jax.lax.optimization_barrier(a_t), b,
                       preferred_element_type=jnp.float32)
  return _swap_last(jax.lax.optimization_barrier(product))


@jax.custom_vjp
def softmax_attention(q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh, bias, visible):
  """softmax(q.k + bias, masked by `visible`) @ v, float32 [B, H, Q, Dh] (module docstring)."""
  return _softmax_attention_fwd(q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh, bias, visible)[0]


def _softmax_attention_fwd(q, k, v, bias, visible):
  logits = attention_scores(q, k, 1.0)
  if bias is not None:
    logits = logits + bias
  logits = jnp.where(visible, logits, NEG_INF)
  m = jnp.max(logits, axis=-1, keepdims=True)
  p = jnp.where(visible, jnp.exp(logits - m), 0.0)
  denom = jnp.sum(p, axis=-1, keepdims=True)
  denom = jnp.where(denom == 0.0, 1.0, denom)
  out = weighted_values(p, v) / denom
  return out, (q, k, v, bias, p, denom, out)


def _softmax_attention_bwd(residuals, d_out_BxHxQxDh):
  q, k, v, bias, p, denom, out = residuals
  b, h, nq, d = q.shape
  g, nk = k.shape[1], k.shape[2]
  grouped = lambda x: x.reshape(b, g, (h // g) * nq, x.shape[-1])
  f32 = jnp.float32
  probs = p / denom
  d_out = grouped(d_out_BxHxQxDh).astype(v.dtype)
  d_v = _transposed_product('bgdx,bgxk->bgdk', _swap_last(d_out),
                             grouped(probs).astype(v.dtype))
  d_probs = jnp.einsum('bgxd,bgkd->bgxk', d_out, v, preferred_element_type=f32)
  row = jnp.sum(d_out_BxHxQxDh.astype(f32) * out, axis=-1, keepdims=True)
  d_logits = probs * (d_probs.reshape(b, h, nq, nk) - row)  # zero where not visible
  d_logits4 = grouped(d_logits).astype(q.dtype)
  d_q = jnp.einsum('bgxk,bgkd->bgxd', d_logits4, k, preferred_element_type=f32)
  d_k = _transposed_product('bgdx,bgxk->bgdk', _swap_last(grouped(q)), d_logits4)
  d_bias = None if bias is None else _sum_to_shape(d_logits, bias.shape).astype(bias.dtype)
  return (d_q.reshape(b, h, nq, d).astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype),
          d_bias, None)


softmax_attention.defvjp(_softmax_attention_fwd, _softmax_attention_bwd)
