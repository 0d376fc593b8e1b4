"""Contextual Position Encoding (CoPE, Golovneva et al. 2024).

Per query head, with scores S_ij = q_i . k_j / sqrt(Dh) (the attention's scaled scores):

  gates      g_ij = sigmoid(S_ij) on visible pairs (causal, valid key), 0 elsewhere;
  positions  p_ij = sum_{t = j .. i} g_it = the suffix sum of g_i. over keys >= j, clamped at
             npos - 1 (fractional; key i itself counts, so p_ii = g_ii in (0, 1));
  logits     S_ij + (q_i . e(p_ij)) / sqrt(Dh), with e(p) the interpolation
             (ceil(p) - p) e[floor p] + (p - floor p) e[ceil p] of learned vectors e [npos, Dh]
             (shared by the heads of a layer, zeros at init, as the official code).

The interpolation is computed on the products q_i . e[n] ([B, H, Q, npos], one matmul), then
gathered at floor / ceil (integer indices: no gradient; the weight p - floor p carries it), as
the official code (facebookresearch/RAM, projects/cope) does.

Encoder mode (`model.causal=False`). A key right of the query (j > i) counts the gates from the
query to it, p_ij = sum_{t = i .. j} g_it (a prefix sum over keys), and reads a second table
e_right ('cope_right'), so a key at the same gated distance on the right is told from one on the
left (the role of the half step of encodings/two_sided.py).

BiPE's segment index is CoPE with gates fixed to the separator flags (then p_ij counts the
separators in [j, i], i.e. inter_i - inter_j when a separator ends its segment); no bilevel
CoPE is defined here: with data-dependent gates the separator flags would only mask the gates,
and we found no clean definition beyond that.

Why CoPE stays dense. p_ij needs every key between j and i: a block's positions depend on all
key blocks to its right, so the block-local recomputation of the flash backward
(flash_attention.py) does not apply; a blockwise version would carry the running suffix sum
from the diagonal backwards in the forward pass and a prefix sum of the positions' cotangents
the other way in the backward pass. It is not built: the model runs CoPE densely and refuses
rows longer than `COPE_DENSE_MAX_TOKENS` (ValueError, one line).
"""

from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

COPE_DENSE_MAX_TOKENS = 8192  # [B, H, T, T] float32 intermediates: 3 GiB per head at 8k


def _gates(scores_BxHxQxK: jax.Array, visible_Bx1xQxK: jax.Array) -> jax.Array:
  return jnp.where(visible_Bx1xQxK, jax.nn.sigmoid(scores_BxHxQxK.astype(jnp.float32)), 0.0)


def cope_positions(scores_BxHxQxK: jax.Array, visible_Bx1xQxK: jax.Array,
                   npos: int) -> jax.Array:
  """p [B, H, Q, K] float32: suffix sums over keys of the visible gates, clamped at npos - 1."""
  gates = _gates(scores_BxHxQxK, visible_Bx1xQxK)
  suffix = jnp.flip(jnp.cumsum(jnp.flip(gates, axis=-1), axis=-1), axis=-1)
  return jnp.minimum(suffix, npos - 1)


def cope_positions_right(scores_BxHxQxK: jax.Array, right_Bx1xQxK: jax.Array,
                         npos: int) -> jax.Array:
  """Encoder mode, keys j >= i: p_ij = prefix sums over keys of the gates of `right` (keys from
  the query on), clamped at npos - 1, float32 [B, H, Q, K]."""
  return jnp.minimum(jnp.cumsum(_gates(scores_BxHxQxK, right_Bx1xQxK), axis=-1), npos - 1)


def _interpolated(qe_BxHxQxN: jax.Array, p_BxHxQxK: jax.Array,
                  offset_BxHxQxK: Optional[jax.Array] = None) -> jax.Array:
  """q . e(p) [B, H, Q, K] from the products q . e[n] (unscaled); `offset` (int) shifts the
  gathered index (the encoder reads its right table from the upper half of `qe`)."""
  lo = jax.lax.stop_gradient(jnp.floor(p_BxHxQxK)).astype(jnp.int32)
  hi = jax.lax.stop_gradient(jnp.ceil(p_BxHxQxK)).astype(jnp.int32)
  w = p_BxHxQxK - lo.astype(jnp.float32)
  if offset_BxHxQxK is not None:
    lo, hi = lo + offset_BxHxQxK, hi + offset_BxHxQxK
  qe = qe_BxHxQxN.astype(jnp.float32)
  at = lambda index: jnp.take_along_axis(qe, index, axis=-1)
  return at(hi) * w + at(lo) * (1.0 - w)


def cope_logits(scores_BxHxQxK: jax.Array, qe_BxHxQxN: jax.Array, visible_Bx1xQxK: jax.Array,
                scale: float) -> jax.Array:
  """S + scale * (q . e(p)), float32 [B, H, Q, K]; qe = q . e[n] (unscaled), N = npos."""
  p = cope_positions(scores_BxHxQxK, visible_Bx1xQxK, qe_BxHxQxN.shape[-1])
  return scores_BxHxQxK.astype(jnp.float32) + scale * _interpolated(qe_BxHxQxN, p)


def cope_logits_two_sided(scores_BxHxQxK: jax.Array, qe_BxHxQxN: jax.Array,
                          qe_right_BxHxQxN: jax.Array, past_Bx1xQxK: jax.Array,
                          right_Bx1xQxK: jax.Array, scale: float) -> jax.Array:
  """Encoder mode: keys j <= i as cope_logits (table e); keys j > i with p = the gates from the
  query to the key (cope_positions_right) and the table e_right. `past` / `right`: the valid
  keys j <= i / j >= i."""
  npos = qe_BxHxQxN.shape[-1]
  p = jnp.where(past_Bx1xQxK, cope_positions(scores_BxHxQxK, past_Bx1xQxK, npos),
                cope_positions_right(scores_BxHxQxK, right_Bx1xQxK, npos))
  # One gather pair over both tables ([e | e_right]): the right keys' indices shifted by npos.
  offset = jnp.where(past_Bx1xQxK, 0, npos)
  both = jnp.concatenate([qe_BxHxQxN, qe_right_BxHxQxN], axis=-1)
  return scores_BxHxQxK.astype(jnp.float32) + scale * _interpolated(both, p, offset)


def cope_transform(qe_BxHxQxN: jax.Array, scale: float,
                   qe_right_BxHxQxN: Optional[jax.Array] = None) -> Callable[..., jax.Array]:
  """CoPE as an attention score transform (attention.py's transform_fn contract) for the
  queries whose q . e products are `qe`: the whole key axis must be in one block (dense).
  With `qe_right` (q . e_right), the encoder mode's two-sided positions."""

  def transform(scores, bias, q_pos_BxQ, k_pos_BxK, k_in_range_BxK):
    del bias
    valid = k_in_range_BxK[:, None, :]
    past = (k_pos_BxK[:, None, :] <= q_pos_BxQ[:, :, None]) & valid
    if qe_right_BxHxQxN is None:
      return cope_logits(scores, qe_BxHxQxN, past[:, None], scale)
    right = (k_pos_BxK[:, None, :] >= q_pos_BxQ[:, :, None]) & valid
    return cope_logits_two_sided(scores, qe_BxHxQxN, qe_right_BxHxQxN, past[:, None],
                                 right[:, None], scale)

  return transform


class CopeEmbedding(nn.Module):
  """The position vectors e: param 'embedding' [npos, Dh] (zeros); returns q . e [B, H, Q, N]."""
  npos: int

  @nn.compact
  def __call__(self, q_BxHxQxDh: jax.Array) -> jax.Array:
    e = self.param('embedding', nn.initializers.zeros, (self.npos, q_BxHxQxDh.shape[-1]),
                   jnp.float32)
    return jnp.einsum('bhqd,nd->bhqn', q_BxHxQxDh.astype(jnp.float32), e)


def check_length(num_keys: int) -> None:
  """ValueError (one line) when a row is too long for CoPE's dense computation."""
  if num_keys > COPE_DENSE_MAX_TOKENS:
    raise ValueError(f'cope: {num_keys} keys exceed COPE_DENSE_MAX_TOKENS='
                     f'{COPE_DENSE_MAX_TOKENS}; CoPE runs densely (its positions are suffix sums '
                     f'over keys, see bipe_jax/encodings/cope.py); use shorter rows.')
