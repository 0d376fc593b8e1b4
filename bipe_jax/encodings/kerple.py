"""Kerple, logarithmic variant (Chi et al. 2022), as used by DAPE.

bias[b, h, i, j] = -p_h * log(1 + a_h * max(q_pos[i] - k_pos[j], 0)), with p, a >= 0.01.

Keeping p and a >= 0.01 while they stay learnable: the official code clamps them in the forward
pass and projects them back to >= 0.01 after every optimizer update. A plain `max(p, 0.01)` in
the forward pass has zero gradient below the clamp, so a head initialised below 0.01 (p ~ U(0, 2),
a ~ U(0, 1): 0.5 % / 1 % per parameter, so most 144-head models have one) would never learn.
Here the forward clamp passes the gradient straight through (`clamp_straight_through`), and the
training optimizer projects every Kerple parameter back to >= 0.01 after each update
(`bipe_jax.state.optimizer.project_parameters`, applied by the train step to parameters
named `KERPLE_PARAM_NAMES` inside a module named `kerple`).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from bipe_jax import input_checks

KERPLE_MIN = 0.01  # official eps: p and a are clamped to >= 0.01 before use
KERPLE_PARAM_NAMES = ('p', 'a')


def clamp_straight_through(x: jax.Array, minimum: float) -> jax.Array:
  """max(x, minimum) in the forward pass, identity gradient (so a value below keeps learning)."""
  return x + jax.lax.stop_gradient(jnp.maximum(x, minimum) - x)


def kerple_log_bias(q_pos_BxQ: jax.Array, k_pos_BxK: jax.Array, p_H: jax.Array,
                    a_H: jax.Array) -> jax.Array:
  """Kerple-log bias [B, H, Q, K] float32 (p and a used as given: clamp them first with
  `clamp_straight_through(x, KERPLE_MIN)`, as KerpleLogBias does)."""
  input_checks.check_positions('kerple_log_bias', q_pos_BxQ=q_pos_BxQ, k_pos_BxK=k_pos_BxK)
  input_checks.check_per_head('kerple_log_bias', p_H=p_H, a_H=a_H)
  distance_Bx1xQxK = jnp.maximum(
      q_pos_BxQ[:, None, :, None] - k_pos_BxK[:, None, None, :], 0).astype(jnp.float32)
  p = jnp.asarray(p_H, jnp.float32)[None, :, None, None]
  a = jnp.asarray(a_H, jnp.float32)[None, :, None, None]
  return -p * jnp.log1p(a * distance_Bx1xQxK)


def _uniform(high: float):
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, 0.0, high)
  return init


class KerpleLogBias(nn.Module):
  """Learned Kerple-log bias: params 'p' [H] ~ U(0, 2) and 'a' [H] ~ U(0, 1), clamped >= 0.01."""
  num_heads: int

  @nn.compact
  def __call__(self, q_pos_BxQ: jax.Array, k_pos_BxK: jax.Array) -> jax.Array:
    p_H = self.param('p', _uniform(2.0), (self.num_heads,), jnp.float32)
    a_H = self.param('a', _uniform(1.0), (self.num_heads,), jnp.float32)
    return kerple_log_bias(q_pos_BxQ, k_pos_BxK, clamp_straight_through(p_H, KERPLE_MIN),
                           clamp_straight_through(a_H, KERPLE_MIN))
