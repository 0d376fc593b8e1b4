"""Forgetting Transformer (FoX, Lin et al. ICLR 2025) and the learned bilevel forget gate.

Forget gate. Per head h and token t, f_t = sigmoid(w_h . x_t + b_h), x_t the attention's input
(after its RMSNorm); the data-independent variant (official `bias_only`) drops w: f_t =
sigmoid(b_h). With c_t = sum_{l <= t} log f_l (a prefix sum along the row, float32), the logit
of query i on key j <= i gets

  D_ij = sum_{l = j+1 .. i} log f_l = c_i - c_j   (<= 0; keys after the query are masked).

FoX is used without RoPE. D depends on c only through differences, so shifting c by a constant
(a per-row offset: the carry of a context shard, the c of a cache's earlier tokens) changes
nothing.

Bilevel forget gate (`bipe_fox`: bias 'fox' on the inter stream). Decay happens only across
segment boundaries: log f_t = s_t * log sigmoid(w . x_t + b), where s_t = 1 when token t is
the FIRST token of a segment, i.e. the valid token right AFTER a separator (intra 0, inter > 0),
and 0 otherwise. So the token after the separator carries
the boundary's gate, from its own layer input. Then c_t = sum of the gates of the boundaries
crossed up to t, and with every gate fixed to log f = -m_h (BiPE-ALiBi's slopes times 96):

  c_i - c_j = -m_h * (inter_i - inter_j),

which is bipe_alibi's bias exactly. A gate on the separator token itself would move the
separator into the next segment (it would decay from its own segment), which is not BiPE's
convention (a separator ends its segment). The intra-segment embedding is BiPE's.

Padding (valid False) takes log f = 0, so c carries across it: left padding is invisible.

Encoder mode (`model.causal=False`, fox_bias_two_sided). Keys after the query decay by the gates
between them, and half a gate further (the project's two-sided rule, encodings/two_sided.py):

  D_ij = c_i - c_j                      for j <= i   (the causal bias)
       = c_j - c_i + (1/2) log f_j      for j >  i   (= sum_{l = i+1 .. j} log f_l + log f_j / 2)

With every gate log f = -m this is the two-sided ALiBi bias -m (j - i + 1/2) on the right; the
half step tells a key on the right from one at the same gated distance on the left. Still a
function of differences of c: shifting c changes nothing.

Shapes: x [B, T, D], log f and c [B, T, H] float32 (the streams that travel beside the
positions; float streams get gradients in every attention path), bias [B, H, Q, K].
"""

import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp


def fox_bias(c_q_BxQxH: jax.Array, c_k_BxKxH: jax.Array) -> jax.Array:
  """D[b, h, i, j] = c_q[b, i, h] - c_k[b, j, h], float32 [B, H, Q, K]."""
  c_q = jnp.moveaxis(c_q_BxQxH.astype(jnp.float32), 2, 1)  # [B, H, Q]
  c_k = jnp.moveaxis(c_k_BxKxH.astype(jnp.float32), 2, 1)  # [B, H, K]
  return c_q[:, :, :, None] - c_k[:, :, None, :]


def fox_bias_two_sided(q_streams: tuple, k_streams: tuple) -> jax.Array:
  """The encoder-mode bias (module docstring), float32 [B, H, Q, K]. q_streams: (c [B, Q, H],
  index [B, Q]); k_streams: (c [B, K, H], log f [B, K, H] (masked), index [B, K])."""
  c_q, index_q = q_streams
  c_k, log_f_k, index_k = k_streams
  left = fox_bias(c_q, c_k)
  right = -fox_bias(c_q, c_k.astype(jnp.float32) + 0.5 * log_f_k.astype(jnp.float32))
  past_Bx1xQxK = index_k[:, None, None, :] <= index_q[:, None, :, None]
  return jnp.where(past_Bx1xQxK, left, right)


def segment_starts(intra_BxT: jax.Array, inter_BxT: jax.Array,
                   valid_BxT: jax.Array) -> jax.Array:
  """bool [B, T]: token t starts a segment other than the row's first (intra 0, inter > 0:
  bipe_jax/positions.py), i.e. it is the valid token right after a separator. Token-local (no
  scan over T), so it needs no carry under context parallelism or in a KV cache."""
  return valid_BxT & (intra_BxT == 0) & (inter_BxT > 0)


def masked_log_gates(log_f_BxTxH: jax.Array, valid_BxT: jax.Array,
                     starts_BxT: Optional[jax.Array] = None) -> jax.Array:
  """log f with padding (and, for the bilevel gate, every token but segment starts) set to 0."""
  keep = valid_BxT if starts_BxT is None else valid_BxT & starts_BxT
  return jnp.where(keep[:, :, None], log_f_BxTxH.astype(jnp.float32), 0.0)


def cumulative_log_gates(log_f_BxTxH: jax.Array,
                         offset_BxH: Optional[jax.Array] = None) -> jax.Array:
  """c [B, T, H] float32: offset + the inclusive prefix sum of log f along T."""
  c = jnp.cumsum(log_f_BxTxH.astype(jnp.float32), axis=1)
  return c if offset_BxH is None else c + offset_BxH[:, None, :].astype(jnp.float32)


def pruning_threshold(q_BxHxQxDh: jax.Array, k_BxGxKxDh: jax.Array, num_keys: int,
                      log_tolerance: float) -> jax.Array:
  """FoX's adaptive pruning threshold (a scalar): a block whose every bias is below
  -(2 U + log K) + log_tolerance, with U = max|q| max|k| / sqrt(Dh) the largest possible score
  magnitude, holds attention weights below exp(log_tolerance) in total (official code: the
  same bound, per head; here the smallest over batch and heads, so one decision per block)."""
  norm = lambda x: jnp.max(jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=-1)))
  upper = norm(q_BxHxQxDh) * norm(k_BxGxKxDh) / math.sqrt(q_BxHxQxDh.shape[-1])
  return jax.lax.stop_gradient(-(2.0 * upper + math.log(max(num_keys, 1))) + log_tolerance)


def block_bias_upper_bound(c_q_BxQxH: jax.Array, c_k_BxKxH: jax.Array) -> jax.Array:
  """A scalar >= every c_i - c_j of a block (max c_q - min c_k, over batch and heads)."""
  return jnp.max(c_q_BxQxH) - jnp.min(c_k_BxKxH)


def block_prune(log_tolerance: float):
  """blockwise_attention's `block_prune` for FoX: (threshold_fn(q, k), bound_fn(c_q, c_k))."""
  threshold = lambda q, k: pruning_threshold(q, k, k.shape[2], log_tolerance)
  return threshold, block_bias_upper_bound


class ForgetGate(nn.Module):
  """log f [B, T, H] float32 = log sigmoid(x . w + b): params 'kernel' [D, H] (N(0, 0.02), only
  when `data_dependent`) and 'bias' [H] (zeros, as the official default: f = 1/2 at init)."""
  num_heads: int
  data_dependent: bool = True

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    bias_H = self.param('bias', nn.initializers.zeros, (self.num_heads,), jnp.float32)
    logits = jnp.broadcast_to(bias_H, (*x_BxTxD.shape[:2], self.num_heads))
    if self.data_dependent:
      kernel = self.param('kernel', nn.initializers.normal(0.02),
                          (x_BxTxD.shape[-1], self.num_heads), jnp.float32)
      logits = logits + jnp.einsum('btd,dh->bth', x_BxTxD.astype(jnp.float32), kernel)
    return jax.nn.log_sigmoid(logits)
