"""Rotary position embedding (RoPE) with linear (PI), NTK-aware and YaRN frequency scaling.

Layout is "rotate half" exactly as Hugging Face Llama: the first and second halves of a head are
the two coordinates of each rotated pair, and frequency i serves features i and i + Dh/2.
BiPE-RoPE calls `apply_rope` with the inter-segment ids as positions; plain RoPE with token
positions. Positions can be any integers. `rotate_fused` is `rotate` (the same values) in the
form XLA fuses into one pass on TPU (the model's Pallas path).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax import input_checks

ROPE_SCALINGS = ('none', 'linear', 'ntk', 'yarn')


def _check_scaling(scaling: str, factor: float):
  if scaling not in ROPE_SCALINGS:
    raise ValueError(f'rope scaling {scaling!r} is not one of {ROPE_SCALINGS}.')
  if scaling != 'none' and not factor >= 1.0:
    raise ValueError(f'rope scaling factor must be >= 1 for scaling={scaling!r}, got {factor}.')


def rope_inv_frequencies(head_dim: int,
                         base: float = 10000.,
                         scaling: str = 'none',
                         factor: float = 1.,
                         original_length: int = 1024,
                         yarn_beta_fast: float = 32.,
                         yarn_beta_slow: float = 1.) -> np.ndarray:
  """Inverse frequencies [Dh/2] float32 (a NumPy constant, usable inside jit).

  none:   theta_i = base**(-2i/Dh).
  linear: theta_i / factor (position interpolation: positions / factor).
  ntk:    base' = base * factor**(Dh / (Dh - 2)), theta_i = base'**(-2i/Dh).
  yarn:   per-frequency blend of interpolated (theta/factor) and original theta by wavelength
          (Peng et al. 2023): dims rotating more than beta_fast times over `original_length`
          keep theta, dims rotating fewer than beta_slow times are interpolated, a linear ramp
          in between (same correction-range rounding as Hugging Face).
  """
  if head_dim <= 0 or head_dim % 2:
    raise ValueError(f'rope head_dim must be a positive even number, got {head_dim}.')
  if not base > 1.0:
    raise ValueError(f'rope base must be > 1, got {base}.')
  _check_scaling(scaling, factor)
  exponent = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
  if scaling == 'ntk':
    if head_dim <= 2:
      raise ValueError(f'ntk scaling needs head_dim > 2, got {head_dim}.')
    base = base * factor**(head_dim / (head_dim - 2))
  inv_freq = 1.0 / base**exponent
  if scaling == 'linear':
    inv_freq = inv_freq / factor
  elif scaling == 'yarn':
    if original_length <= 0:
      raise ValueError(f'yarn original_length must be positive, got {original_length}.')

    def correction_dim(num_rotations):
      # The dim whose wavelength fits `num_rotations` times into original_length.
      return (head_dim * math.log(original_length / (num_rotations * 2 * math.pi)) /
              (2 * math.log(base)))

    low = max(math.floor(correction_dim(yarn_beta_fast)), 0)
    high = min(math.ceil(correction_dim(yarn_beta_slow)), head_dim - 1)
    if low == high:
      high += 0.001
    ramp = np.clip((np.arange(head_dim // 2) - low) / (high - low), 0.0, 1.0)
    keep_original = 1.0 - ramp  # 1: extrapolate (high frequency), 0: interpolate
    inv_freq = inv_freq / factor * (1.0 - keep_original) + inv_freq * keep_original
  return inv_freq.astype(np.float32)


def rope_attention_scale(scaling: str = 'none', factor: float = 1.) -> float:
  """YaRN's magnitude correction 0.1*ln(s) + 1 (1.0 for other scalings or s <= 1).

  `apply_rope` multiplies both q and k by it, so logits grow by its square, as in YaRN.
  """
  _check_scaling(scaling, factor)
  if scaling != 'yarn' or factor <= 1.0:
    return 1.0
  return 0.1 * math.log(factor) + 1.0


def rotate_half(x: jax.Array) -> jax.Array:
  """[x1, x2] -> [-x2, x1] on the last axis."""
  x1, x2 = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x_BxHxTxDh: jax.Array, positions_BxT: jax.Array, inv_freq,
               attention_scale: float = 1.) -> jax.Array:
  """Rotates q or k [B, H, T, Dh] by `positions` [B, T] (or [1, T]); same shape and dtype.

  out = (x * cos + rotate_half(x) * sin) * attention_scale with angles pos * [f, f], computed
  in float32 and cast back to x.dtype. A [B, T, H, Dh] x is refused when H != T (when H == T
  the two layouts have the same shape and cannot be told apart).
  """
  input_checks.check_heads_layout('apply_rope', x_BxHxTxDh, positions_BxT)
  dh = x_BxHxTxDh.shape[-1]
  if jnp.shape(inv_freq) != (dh // 2,) or dh % 2:
    raise ValueError(
        f'apply_rope: inv_freq must have shape ({dh // 2},) for head_dim {dh}, got '
        f'{jnp.shape(inv_freq)}.')
  return rotate(x_BxHxTxDh, *rope_cos_sin(positions_BxT, inv_freq, attention_scale))


def rope_cos_sin(positions_BxT: jax.Array, inv_freq,
                 attention_scale: float = 1.) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) float32 [B, 1, T, Dh] of angles pos * [f, f], times `attention_scale`.

  Computing them once per forward pass and rotating every layer's q and k with `rotate` does
  the sin/cos work once instead of once per layer, head and q/k (apply_rope does both steps).
  """
  inv_freq = jnp.asarray(inv_freq, dtype=jnp.float32)
  angles_Bx1xTxF = positions_BxT.astype(jnp.float32)[:, None, :, None] * inv_freq
  angles = jnp.concatenate([angles_Bx1xTxF, angles_Bx1xTxF], axis=-1)
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  if not (isinstance(attention_scale, (int, float)) and attention_scale == 1.):
    cos, sin = cos * attention_scale, sin * attention_scale
  return cos, sin


def rotate(x_BxHxTxDh: jax.Array, cos_Bx1xTxDh: jax.Array, sin_Bx1xTxDh: jax.Array) -> jax.Array:
  """x * cos + rotate_half(x) * sin in float32, cast back to x.dtype (tables: rope_cos_sin)."""
  x = x_BxHxTxDh.astype(jnp.float32)
  return (x * cos_Bx1xTxDh + rotate_half(x) * sin_Bx1xTxDh).astype(x_BxHxTxDh.dtype)


def _partner_matrix(head_dim: int, dtype) -> jax.Array:
  """[Dh, Dh] 0/1: column j picks feature (j + Dh/2) mod Dh, the other coordinate of j's pair."""
  p = np.zeros((head_dim, head_dim), np.float32)
  p[(np.arange(head_dim) + head_dim // 2) % head_dim, np.arange(head_dim)] = 1.0
  return jnp.asarray(p, dtype)


def _mix_pairs(x_BxHxTxDh: jax.Array, cos_Bx1xTxDh: jax.Array,
               signed_sin_Bx1xTxDh: jax.Array) -> jax.Array:
  """(x * cos + partner(x) * signed_sin) in float32, cast back to x.dtype, in one pass.

  partner(x) swaps the halves of the last axis. It is read through a product with a 0/1
  permutation matrix (float32 accumulation, full precision), so every output element is
  one elementwise expression of x and a product's output: XLA (TPU) fuses the whole rotation
  into that product's epilogue, where slicing and concatenating halves would materialise them
  (issue 53). Exact: each output of the product is one input times 1 plus zeros."""
  dh = x_BxHxTxDh.shape[-1]
  precision = (None if x_BxHxTxDh.dtype == jnp.bfloat16 else jax.lax.Precision.HIGHEST)
  partner = jnp.einsum('bhtk,kj->bhtj', x_BxHxTxDh, _partner_matrix(dh, x_BxHxTxDh.dtype),
                       preferred_element_type=jnp.float32, precision=precision)
  x = x_BxHxTxDh.astype(jnp.float32)
  return (x * cos_Bx1xTxDh + partner * signed_sin_Bx1xTxDh).astype(x_BxHxTxDh.dtype)


def signed_sin(sin_Bx1xTxDh: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(forward, backward) sin tables of `rotate_fused`: [-s1, s2] and [s2, -s1] for the halves
  s1, s2 of the last axis (rotate_half's sign, and its transpose's, folded into the table)."""
  s1, s2 = jnp.split(sin_Bx1xTxDh, 2, axis=-1)
  return jnp.concatenate([-s1, s2], axis=-1), jnp.concatenate([s2, -s1], axis=-1)


@jax.custom_vjp
def _rotate_fused(x, cos, sin):
  return _mix_pairs(x, cos, signed_sin(sin)[0])


def _rotate_fused_fwd(x, cos, sin):
  # The residuals are the tables themselves: nothing per layer beyond what rotate keeps.
  return _mix_pairs(x, cos, signed_sin(sin)[0]), (cos, sin)


def _rotate_fused_bwd(residuals, d_out):
  cos, sin = residuals
  # The transpose of x -> x * cos + rotate_half(x) * sin is the same kind of pass:
  # d_x = d * cos + partner(d) * [s2, -s1] (float32, cast to x's dtype, as autodiff of rotate).
  return _mix_pairs(d_out, cos, signed_sin(sin)[1]), None, None


_rotate_fused.defvjp(_rotate_fused_fwd, _rotate_fused_bwd)


def rotate_fused(x_BxHxTxDh: jax.Array, cos_Bx1xTxDh: jax.Array,
                 sin_Bx1xTxDh: jax.Array) -> jax.Array:
  """`rotate` (same values) computed so that XLA fuses it: one pass over x forward and one over
  the cotangent backward, no float32 halves materialised (`_mix_pairs`). The tables get no
  gradient (they come from integer positions). For the TPU kernel's path; on CPU `rotate` is
  cheaper (the permutation product costs Dh multiply-adds per element)."""
  if x_BxHxTxDh.shape[-1] % 2:
    raise ValueError(f'rotate_fused: head_dim must be even, got {x_BxHxTxDh.shape[-1]}.')
  return _rotate_fused(x_BxHxTxDh, cos_Bx1xTxDh, sin_Bx1xTxDh)


def rope_log_scale(positions_BxT: jax.Array, train_length: int,
                   min_scale=None) -> jax.Array:
  """BiPE's optional query scale log(pos + 1) / log(train_length), [B, T] float32.

  Multiply q by it (broadcast over heads and Dh) before RoPE. `min_scale` (e.g. 1.0) clips it
  from below, the common "log-n" variant that leaves positions inside the training length alone.
  """
  if train_length <= 1:
    raise ValueError(f'rope_log_scale: train_length must be > 1, got {train_length}.')
  scale = jnp.log1p(positions_BxT.astype(jnp.float32)) / math.log(train_length)
  if min_scale is not None:
    scale = jnp.maximum(scale, min_scale)
  return scale
