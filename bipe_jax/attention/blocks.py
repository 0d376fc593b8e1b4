"""The per-block pieces that dense, blockwise and flash attention share: which pairs are
visible, a block's logits (scores + bias, or the score transform), and padding / slicing along
an axis. Layouts as in attention.py: q [B, H, q, Dh], k [B, G, k, Dh], positions [B, q] / [B, k].
"""

import jax
import jax.numpy as jnp

from bipe_jax.kernels.gqa_products import attention_scores

POS_PAD = jnp.iinfo(jnp.int32).max  # causal index of padded keys (never visible)
QPOS_PAD = jnp.iinfo(jnp.int32).min  # causal index of padded queries (see nothing)


def visible(q_pos, k_pos, causal, k_valid, q_document, k_document, mask_fn, q_streams,
            k_streams):
  """bool [B or 1, 1, q, k]: which (query, key) pairs may attend."""
  b = q_pos.shape[0]
  vis = jnp.ones((b, q_pos.shape[1], k_pos.shape[1]), bool)
  if causal:
    vis = k_pos[:, None, :] <= q_pos[:, :, None]
  if k_valid is not None:
    vis = vis & k_valid[:, None, :]
  if q_document is not None:
    vis = vis & (q_document[:, :, None] == k_document[:, None, :])
  if mask_fn is not None:
    vis = vis & mask_fn(q_streams, k_streams)
  return vis[:, None]


def block_logits(q, k, q_pos, k_pos, q_streams, k_streams, k_in_range, *, scale, bias_fn,
                 transform_fn):
  """Final pre-mask logits of one block: S + B, or transform(S, B), float32 [B, H, q, k]."""
  scores = attention_scores(q, k, scale)
  bias = None if bias_fn is None else bias_fn(q_streams, k_streams).astype(jnp.float32)
  if transform_fn is not None:
    return transform_fn(scores, bias, q_pos, k_pos, k_in_range).astype(jnp.float32)
  return scores if bias is None else scores + bias


def pad_axis(x, axis, before, after, value):
  if before == 0 and after == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (before, after)
  return jnp.pad(x, widths, constant_values=value)


def slice_block(x, start, size, axis):
  return jax.lax.dynamic_slice_in_dim(x, start, size, axis=axis)
