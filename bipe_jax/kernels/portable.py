"""The portable path (model.kernels='portable', and 'auto' off CPU): the stock forms that XLA's
TPU / GPU compilers and GSPMD sharding propagation are built for. Einsum projections and JAX's
own autodiff, sin / cos evaluated in the program, `jax.nn.dot_product_attention` for the dense
softmax core; no optimization barriers and no custom primitives, so the program shards and
differentiates anywhere JAX does (inside `jax.shard_map` with its default check_vma included).
The function contract is in bipe_jax/kernels/__init__.py.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from bipe_jax.encodings import rope


def project(equation: str, x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`jnp.einsum(equation, x, kernel)`: one dot_general that XLA lays out for its target."""
  return jnp.einsum(equation, x, kernel)


def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
  """silu(gate) * up, differentiated by JAX (the compiler fuses and rematerialises it)."""
  return jax.nn.silu(gate) * up


def rope_cos_sin(positions_BxT: jax.Array, inv_freq, attention_scale: float = 1.,
                 num_positions: Optional[int] = None) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) float32 [B, 1, T, Dh] computed in the program (`rope.rope_cos_sin`);
  `num_positions` (a bound on the positions) is not needed here."""
  del num_positions
  return rope.rope_cos_sin(positions_BxT, inv_freq, attention_scale)


def softmax_attention(q_BxHxQxDh: jax.Array, k_BxGxKxDh: jax.Array, v_BxGxKxDh: jax.Array,
                      bias: Optional[jax.Array], visible: jax.Array) -> jax.Array:
  """softmax(q.k + bias, masked by `visible`) @ v, float32 [B, H, Q, Dh] (q already scaled),
  by `jax.nn.dot_product_attention` (GQA included); a row with no visible key gives zeros.

  bias: None or float32 [B or 1, H, Q, K]; visible: bool [B or 1, 1, Q, K].
  """
  to_bthd = lambda x: jnp.swapaxes(x, 1, 2)
  out_BxQxHxDh = jax.nn.dot_product_attention(
      to_bthd(q_BxHxQxDh), to_bthd(k_BxGxKxDh), to_bthd(v_BxGxKxDh), bias=bias, mask=visible,
      scale=1.0)
  seen_Bx1xQx1 = jnp.any(visible, axis=-1, keepdims=True)  # all masked: uniform weights there
  return jnp.where(seen_Bx1xQx1, jnp.swapaxes(out_BxQxHxDh, 1, 2), 0.0).astype(jnp.float32)


def lm_head_scan_inputs(hidden_NxMxD: jax.Array) -> None:
  """Nothing besides the hidden states: the kernel gradient reads them as they are."""
  del hidden_NxMxD


def lm_head_kernel_gradient(h_MxD: jax.Array, extra: None, d_logits_MxV: jax.Array) -> jax.Array:
  """h^T @ d_logits [D, V] float32 (one dot_general contracting the rows of both)."""
  del extra
  return jnp.einsum('md,mv->dv', h_MxD, d_logits_MxV).astype(jnp.float32)
