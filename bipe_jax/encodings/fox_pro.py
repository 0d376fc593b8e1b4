"""FoX's "Pro" attention parts (Lin et al. ICLR 2025, the official Pro configuration) and its
fixed forget gate.

The Pro layer keeps FoX's forget-gate bias (encodings/fox.py) and adds four parts around the
attention core, none of which reads a position, so every attention path (dense, blockwise,
Pallas), the KV cache and encoder mode run them unchanged:

- Key / value shift (official `use_k_shift`, `use_v_shift`). The projected key of token t is
  mixed with the previous token's, per kv head with a data-dependent weight:

    a_t = sigmoid(x_t . w_h)                      (Linear(hidden -> heads, no bias))
    k_t = a_t * k'_{t-1} + (1 - a_t) * k'_t        (k' = x W_k; k'_{-1} = 0)

  and the same for values with their own w. Padding tokens' k' is zeroed before the shift (as
  the official mask does), and so is the previous token at a document start when packed
  documents are masked apart (the official code sees one document per row). A KV cache keeps
  the last k' and v' of each row, so a chunk continues from the token before it.
- QK-norm (official `qk_norm`): RMSNorm over each head's q and k (eps 1e-5, a scale per head
  and channel, ones at init), after the shift.
- Output norm and output gate (official `use_output_norm` with `use_output_gate`, sigmoid):
  o_t = RMSNorm_head(o_t) * scale * sigmoid(x_t W_g) per head (eps 1e-6), before the output
  projection (W_g: Linear(hidden -> heads * head_dim, no bias)).

Fixed forget gate (official `fgate_type='fixed'`): log f_t = log sigmoid(b_h) with constants
b_h = -log(expm1(1 / tau_h)), tau_h log-spaced from T_min to T_max across heads (a gate whose
decay time -1 / log f is tau_h); no parameters.

Weights are N(0, 0.02) like the official Linear layers. Shapes: x [B, T, D]; q [B, H, T, Dh];
k, v [B, G, T, Dh]; gates [B, T, G]; the attention's output [B, H, T, Dh].
"""

import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

QK_NORM_EPS = 1e-5  # the official GroupNorm's default
OUTPUT_NORM_EPS = 1e-6  # the official model's norm_eps
_INIT = nn.initializers.normal(0.02)


def decay_time_biases(num_heads: int, decay_time_min: float, decay_time_max: float) -> np.ndarray:
  """b [H] float32: b_h = -log(expm1(1 / tau_h)), tau_h = exp(linspace(log T_min, log T_max))
  (one head: T_min), so that sigmoid(b_h) has decay time -1 / log sigmoid(b_h) = tau_h."""
  if not 0 < decay_time_min <= decay_time_max:
    raise ValueError(f'FoX fixed gate: decay times must satisfy 0 < min <= max, got '
                     f'{decay_time_min}, {decay_time_max}.')
  tau = np.exp(np.linspace(math.log(decay_time_min), math.log(decay_time_max), num_heads))
  return (-np.log(np.expm1(1.0 / tau))).astype(np.float32)


def fixed_log_gates(num_heads: int, decay_time_min: float, decay_time_max: float,
                    batch: int, length: int) -> jax.Array:
  """log f [B, T, H] float32 of the fixed gate: log sigmoid(b_h) in every position."""
  b = jnp.asarray(decay_time_biases(num_heads, decay_time_min, decay_time_max))
  return jnp.broadcast_to(jax.nn.log_sigmoid(b), (batch, length, num_heads))


def token_shift(x_BxGxTxDh: jax.Array, alpha_BxTxG: jax.Array, keep_BxT: jax.Array,
                continues_BxT: jax.Array,
                before_BxGxDh: Optional[jax.Array] = None) -> jax.Array:
  """out_t = a_t * x_{t-1} + (1 - a_t) * x_t per head, with x zeroed where `keep` is False and
  x_{t-1} taken as 0 where `continues` is False (a document start); x_{-1} = `before` (the
  cache's last token, already masked) or 0. float32 mixing, cast back to x's dtype."""
  dtype = x_BxGxTxDh.dtype
  x = jnp.where(keep_BxT[:, None, :, None], x_BxGxTxDh.astype(jnp.float32), 0.0)
  first = (jnp.zeros_like(x[:, :, :1]) if before_BxGxDh is None
           else before_BxGxDh[:, :, None, :].astype(jnp.float32))
  previous = jnp.concatenate([first, x[:, :, :-1]], axis=2)
  previous = jnp.where(continues_BxT[:, None, :, None], previous, 0.0)
  a = jnp.moveaxis(alpha_BxTxG.astype(jnp.float32), 2, 1)[..., None]  # [B, G, T, 1]
  return (a * previous + (1.0 - a) * x).astype(dtype)


def head_rms_norm(x_BxHxTxDh: jax.Array, scale_HxDh: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over each head's channels (float32), times a per-head, per-channel scale."""
  x = x_BxHxTxDh.astype(jnp.float32)
  y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
  return (y * scale_HxDh[None, :, None, :].astype(jnp.float32)).astype(x_BxHxTxDh.dtype)


class ShiftGate(nn.Module):
  """a [B, T, heads] float32 = sigmoid(x . w): param 'kernel' [D, heads] (N(0, 0.02))."""
  num_heads: int

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    kernel = self.param('kernel', _INIT, (x_BxTxD.shape[-1], self.num_heads), jnp.float32)
    return jax.nn.sigmoid(jnp.einsum('btd,dh->bth', x_BxTxD.astype(jnp.float32), kernel))


class HeadNorm(nn.Module):
  """Per-head RMSNorm of [B, heads, T, Dh]: param 'scale' [heads, Dh] (ones)."""
  num_heads: int
  eps: float

  @nn.compact
  def __call__(self, x_BxHxTxDh: jax.Array) -> jax.Array:
    scale = self.param('scale', nn.initializers.ones, (self.num_heads, x_BxHxTxDh.shape[-1]),
                       jnp.float32)
    return head_rms_norm(x_BxHxTxDh, scale, self.eps)


class GatedOutputNorm(nn.Module):
  """The Pro output: RMSNorm_head(o) * scale * sigmoid(x W_g), [B, H, T, Dh]; params 'scale'
  [H, Dh] (ones) and 'gate' [D, H, Dh] (N(0, 0.02))."""
  num_heads: int

  @nn.compact
  def __call__(self, out_BxHxTxDh: jax.Array, x_BxTxD: jax.Array) -> jax.Array:
    dh = out_BxHxTxDh.shape[-1]
    gate = self.param('gate', _INIT, (x_BxTxD.shape[-1], self.num_heads, dh), jnp.float32)
    g = jax.nn.sigmoid(jnp.einsum('btd,dhk->bhtk', x_BxTxD.astype(jnp.float32), gate))
    normed = HeadNorm(self.num_heads, OUTPUT_NORM_EPS, name='norm')(out_BxHxTxDh)
    return (normed.astype(jnp.float32) * g).astype(out_BxHxTxDh.dtype)
