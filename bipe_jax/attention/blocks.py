"""The per-block pieces that dense, blockwise and flash attention share: a block's logits
(scores + bias, or the score transform), and padding / slicing along an axis (which pairs are
visible: mask.py). Layouts as in core.py: q [B, H, q, Dh], k [B, G, k, Dh], positions [B, q] /
[B, k].
"""

import jax
import jax.numpy as jnp

from bipe_jax.kernels.gqa_products import attention_scores


def block_logits(q, k, mask, q_streams, k_streams, *, scale, bias_fn, transform_fn):
  """Final pre-mask logits of one block: S + B, or transform(S, B), float32 [B, H, q, k].

  q [B, H, q, Dh], k [B, G, k, Dh]; `mask` (mask.AttentionMask of the block) gives the
  transform its causal indices and the keys in range.
  """
  scores = attention_scores(q, k, scale)
  bias = None if bias_fn is None else bias_fn(q_streams, k_streams).astype(jnp.float32)
  if transform_fn is not None:
    return transform_fn(scores, bias, mask.q_pos, mask.k_pos,
                        mask.keys_in_range()).astype(jnp.float32)
  return scores if bias is None else scores + bias


def pad_axis(x, axis, before, after, value):
  """x padded with `value`: `before` / `after` entries on `axis`."""
  if before == 0 and after == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (before, after)
  return jnp.pad(x, widths, constant_values=value)


def slice_block(x, start, size, axis):
  """x[start : start + size] along `axis` (start may be traced)."""
  return jax.lax.dynamic_slice_in_dim(x, start, size, axis=axis)
