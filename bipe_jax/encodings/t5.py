"""T5 relative position bias (Raffel et al. 2020): a learned [buckets, H] table over log buckets.

Buckets of the distance n = q - k (causal: n clamped at 0): n < num_buckets/2 gets its own
bucket; larger n share logarithmically wider buckets up to max_distance, beyond which all fall
in the last bucket. Bidirectional: half the buckets for each sign, future keys (k > q) offset
by num_buckets/2.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp


def t5_relative_bucket(distance: jax.Array, num_buckets: int = 32, max_distance: int = 128,
                       bidirectional: bool = False) -> jax.Array:
  """Bucket ids (int32, same shape) of `distance = q_pos - k_pos` (positive for past keys)."""
  if num_buckets < 2:
    raise ValueError(f't5: num_buckets must be >= 2, got {num_buckets}.')
  distance = jnp.asarray(distance).astype(jnp.int32)
  offset = 0
  if bidirectional:
    num_buckets //= 2
    offset = jnp.where(distance < 0, num_buckets, 0)
    n = jnp.abs(distance)
  else:
    n = jnp.maximum(distance, 0)
  max_exact = num_buckets // 2
  if max_distance <= max_exact:
    raise ValueError(f't5: max_distance ({max_distance}) must exceed num_buckets/2 '
                     f'(per direction) = {max_exact}.')
  n_f = jnp.maximum(n, max_exact).astype(jnp.float32)
  large = max_exact + (jnp.log(n_f / max_exact) / math.log(max_distance / max_exact) *
                       (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return (offset + jnp.where(n < max_exact, n, large)).astype(jnp.int32)


def t5_bias(q_pos_BxQ: jax.Array, k_pos_BxK: jax.Array, table_NxH: jax.Array,
            num_buckets: int = 32, max_distance: int = 128,
            bidirectional: bool = False) -> jax.Array:
  """Bias [B, H, Q, K] float32: table[bucket(q - k)]."""
  if table_NxH.shape[0] != num_buckets:
    raise ValueError(f't5: table has {table_NxH.shape[0]} rows, expected num_buckets='
                     f'{num_buckets}.')
  distance = q_pos_BxQ[:, :, None] - k_pos_BxK[:, None, :]
  bucket_BxQxK = t5_relative_bucket(distance, num_buckets, max_distance, bidirectional)
  table_HxN = jnp.asarray(table_NxH, jnp.float32).T
  return jnp.moveaxis(table_HxN[:, bucket_BxQxK], 0, 1)


class T5RelativeBias(nn.Module):
  """Learned T5 bias; param 'rel_embedding' [num_buckets, H], init normal(0.02)."""
  num_heads: int
  num_buckets: int = 32
  max_distance: int = 128
  bidirectional: bool = False

  @nn.compact
  def __call__(self, q_pos_BxQ: jax.Array, k_pos_BxK: jax.Array) -> jax.Array:
    table = self.param('rel_embedding', nn.initializers.normal(stddev=0.02),
                       (self.num_buckets, self.num_heads), jnp.float32)
    return t5_bias(q_pos_BxQ, k_pos_BxK, table, self.num_buckets, self.max_distance,
                   self.bidirectional)
