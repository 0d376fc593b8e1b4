"""Hierarchical BiPE's rotary encoding: two segment streams share one head (docs/design.md).

Hierarchical BiPE (scheme `bipe3_rope`) has three levels: the token inside its sentence (the
learned intra embedding at the input, as BiPE), the sentence inside its paragraph and the
paragraph inside the row. The two upper levels are relative, by a two-dimensional RoPE: the
rotary frequencies f_0 > f_1 > ... > f_{F-1} (F = Dh / 2) are dealt alternately to the two
streams, even j to the sentence-in-paragraph stream and odd j to the paragraph stream, so each
stream rotates its pairs over the whole (log-spaced) frequency range and the q.k product of a
head depends only on (paragraph distance, sentence-in-paragraph distance).
"""

import jax
import jax.numpy as jnp


def frequency_owner(head_dim: int) -> jax.Array:
  """bool [Dh]: True where the pair's frequency belongs to the paragraph stream (odd j), in the
  [f_0..f_{F-1}, f_0..f_{F-1}] layout of rope.rope_cos_sin."""
  if head_dim % 2:
    raise ValueError(f'head_dim must be even for rotary encodings, got {head_dim}.')
  j = jnp.arange(head_dim) % (head_dim // 2)
  return j % 2 == 1


def mix_rotary_tables(sentence_tables: tuple, paragraph_tables: tuple) -> tuple:
  """(cos, sin) [B, 1, T, Dh]: the sentence stream's tables at even frequencies, the paragraph
  stream's at odd ones (both arguments are (cos, sin) [B, 1, T, Dh] of the same RoPE)."""
  (cos_s, sin_s), (cos_p, sin_p) = sentence_tables, paragraph_tables
  owner = frequency_owner(cos_s.shape[-1])
  return jnp.where(owner, cos_p, cos_s), jnp.where(owner, sin_p, sin_s)
