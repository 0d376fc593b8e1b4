"""Absolute position embeddings: the sinusoidal table and a learned table.

BiPE adds one of these, indexed by the intra-segment position, to the token embeddings at the
input; the 'sinusoidal' / 'learned' baselines index them by the token position.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bipe_jax.encodings import initializers


def sinusoidal_embedding(positions_BxT: jax.Array, dim: int,
                         max_timescale: float = 10000.) -> jax.Array:
  """Sinusoidal embedding [B, T, D] float32 of arbitrary integer positions.

  Frequencies as Vaswani et al.: w_i = max_timescale**(-i / (D//2)), i = 0..D//2-1; layout as
  tensor2tensor: sin(pos * w) on the first half of the features, cos(pos * w) on the second
  half. An odd D gets one trailing zero feature.
  """
  if dim <= 0:
    raise ValueError(f'sinusoidal_embedding: dim must be positive, got {dim}.')
  half = dim // 2
  inv_timescales_F = jnp.exp(
      jnp.arange(half, dtype=jnp.float32) * (-math.log(max_timescale) / max(half, 1)))
  angles_BxTxF = positions_BxT.astype(jnp.float32)[..., None] * inv_timescales_F
  out = jnp.concatenate([jnp.sin(angles_BxTxF), jnp.cos(angles_BxTxF)], axis=-1)
  if dim % 2:
    out = jnp.pad(out, [(0, 0)] * (out.ndim - 1) + [(0, 1)])
  return out


class LearnedPositionEmbedding(nn.Module):
  """A learned table [num_positions, features]; positions >= num_positions use the last row.

  Attributes:
    num_positions: table size (official BiPE intra table: 1024 = the training length).
    features: embedding width D.
    zero_last_row: reproduce the official quirk (`padding_idx=-1` in PyTorch): the last row is
      always zero and gets no gradient, so clamped (too long) positions add nothing.
    dtype: dtype of the output.
  """
  num_positions: int
  features: int
  zero_last_row: bool = False
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, positions_BxT: jax.Array) -> jax.Array:
    """Embeds int positions [B, T] -> [B, T, features]."""
    if self.num_positions <= 0:
      raise ValueError(f'num_positions must be positive, got {self.num_positions}.')
    table_NxD = self.param(
        'embedding',
        initializers.logically_partitioned(nn.initializers.normal(stddev=0.02),
                                           ('positions', 'embed')),
        (self.num_positions, self.features), self.param_dtype)
    if self.zero_last_row:
      table_NxD = table_NxD.at[-1].set(0)
    index_BxT = jnp.clip(positions_BxT, 0, self.num_positions - 1)
    return jnp.take(table_NxD, index_BxT, axis=0).astype(self.dtype)
