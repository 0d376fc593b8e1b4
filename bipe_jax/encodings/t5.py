"""T5 relative position bias (Raffel et al. 2020): a learned [buckets, H] weight over log buckets.

As the official DAPE / GPT-NeoX code computes it: bias = weight[bucket] * scale with
scale = sqrt(head_dim), added to the already scaled scores q.k / sqrt(head_dim); the weight is
initialised with PyTorch's xavier_normal_ (docs/design.md has the files and lines). A plain
table (bias = table[bucket], scale 1) is the same function family: `t5_table_from_weight` and
`t5_weight_from_table` convert between the two.

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
            bidirectional: bool = False, scale: float = 1.0) -> jax.Array:
  """Bias [B, H, Q, K] float32: table[bucket(q - k)] * scale."""
  if table_NxH.shape[0] != num_buckets:
    raise ValueError(f't5: table has {table_NxH.shape[0]} rows, expected num_buckets='
                     f'{num_buckets}.')
  distance = q_pos_BxQ[:, :, None] - k_pos_BxK[:, None, :]
  bucket_BxQxK = t5_relative_bucket(distance, num_buckets, max_distance, bidirectional)
  table_HxN = jnp.asarray(table_NxH, jnp.float32).T
  return jnp.moveaxis(table_HxN[:, bucket_BxQxK], 0, 1) * jnp.float32(scale)


def t5_scale(head_dim: int) -> float:
  """The official bias scale: sqrt(head_dim)."""
  return math.sqrt(head_dim)


def t5_table_from_weight(weight_NxH: jax.Array, scale: float) -> jax.Array:
  """The plain table (bias = table[bucket]) of a scaled weight: weight * scale, float32.

  Gathering commutes with the product, so t5_bias(table, scale=1) equals
  t5_bias(weight, scale=scale) bit for bit.
  """
  return jnp.asarray(weight_NxH, jnp.float32) * jnp.float32(scale)


def t5_weight_from_table(table_NxH: jax.Array, scale: float) -> jax.Array:
  """The scaled weight of a plain table: table / scale, float32 (exact when scale is a power
  of two, e.g. head_dim 16, 64, 256; otherwise within one rounding)."""
  return jnp.asarray(table_NxH, jnp.float32) / jnp.float32(scale)


def xavier_normal(key, shape, dtype=jnp.float32):
  """PyTorch's xavier_normal_ for a 2-D weight: normal, std sqrt(2 / (fan_in + fan_out)),
  fan_in = shape[1], fan_out = shape[0] (untruncated, unlike flax's glorot_normal)."""
  if len(shape) != 2:
    raise ValueError(f'xavier_normal: expected a 2-D shape, got {shape}.')
  std = math.sqrt(2.0 / (shape[0] + shape[1]))
  return std * jax.random.normal(key, shape, dtype)


class T5RelativeBias(nn.Module):
  """Learned T5 bias = rel_embedding[bucket] * scale; param 'rel_embedding' [num_buckets, H],
  init xavier_normal (official). scale: sqrt(head_dim) in the model (`t5_scale`)."""
  num_heads: int
  num_buckets: int = 32
  max_distance: int = 128
  bidirectional: bool = False
  scale: float = 1.0

  @nn.compact
  def __call__(self, q_pos_BxQ: jax.Array, k_pos_BxK: jax.Array) -> jax.Array:
    weight = self.param('rel_embedding', xavier_normal, (self.num_buckets, self.num_heads),
                        jnp.float32)
    return t5_bias(q_pos_BxQ, k_pos_BxK, weight, self.num_buckets, self.max_distance,
                   self.bidirectional, self.scale)
