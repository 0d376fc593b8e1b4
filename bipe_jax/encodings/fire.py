"""FIRE: functional interpolation for relative positions (Li et al. 2024), as in DAPE's code.

  psi(x) = log(|c * x| + 1)
  d      = psi(max(q - k, 0)) / (psi(max(L, q)) + 1e-6),   L = |L_multiplier * init_L|
  bias   = MLP(d): Linear(1 -> hidden) -> act -> Linear(hidden -> H), [B, H, Q, K].

act is ReLU in plain FIRE and LeakyReLU(0.01) in FIRE under DAPE (V1 and V2), as in the
official classes (`negative_slope`; docs/design.md has the file and line). `init_L` here is the
threshold L0 itself (what the official classes store; bipe_jax.config.ModelConfig.fire_L0
derives it). Distances are float32. Keys after the query (k > q, masked by the caller) get
distance 0.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
from bipe_jax.encodings import initializers

FIRE_EPS = 1e-6


def fire_bias(q_pos_BxQ: jax.Array, k_pos_BxK: jax.Array, *, c, l_multiplier, init_L,
              w_in_1xN, b_in_N, w_out_NxH, b_out_H, eps: float = FIRE_EPS,
              negative_slope: float = 0.0) -> jax.Array:
  """FIRE bias [B, H, Q, K] float32 from the MLP weights and the scalars c, L_multiplier.

  negative_slope: 0 = ReLU (plain FIRE), 0.01 = LeakyReLU (FIRE under DAPE).
  """
  q = q_pos_BxQ.astype(jnp.float32)[:, :, None]
  k = k_pos_BxK.astype(jnp.float32)[:, None, :]
  c = jnp.asarray(c, jnp.float32)
  psi = lambda x: jnp.log(jnp.abs(c * x) + 1.0)
  threshold = jnp.abs(jnp.asarray(l_multiplier, jnp.float32) * init_L)
  normaliser_BxQx1 = psi(jnp.maximum(q, threshold)) + eps
  d_BxQxK = psi(jnp.maximum(q - k, 0.0)) / normaliser_BxQx1
  pre_BxQxKxN = d_BxQxK[..., None] * w_in_1xN[0] + b_in_N
  hidden_BxQxKxN = (jax.nn.leaky_relu(pre_BxQxKxN, negative_slope) if negative_slope
                    else jax.nn.relu(pre_BxQxKxN))
  out = jnp.einsum('bqkn,nh->bhqk', hidden_BxQxKxN, w_out_NxH)
  return out + jnp.asarray(b_out_H)[None, :, None, None]


class FireBias(nn.Module):
  """Learned FIRE bias.

  Attributes:
    num_heads: H.
    hidden: MLP width (32).
    init_c: initial c (0.1).
    init_L: the threshold L0 (a fixed attribute, not a parameter; ModelConfig.fire_L0).
    negative_slope: 0 = ReLU (plain FIRE), 0.01 = LeakyReLU (under DAPE, official).
  Params: 'c' [], 'L_multiplier' [] (init 1.0), 'w_in' [1, hidden], 'b_in' [hidden],
    'w_out' [hidden, H], 'b_out' [H] (PyTorch nn.Linear init).
  """
  num_heads: int
  hidden: int = 32
  init_c: float = 0.1
  init_L: float = 512.
  negative_slope: float = 0.0

  @nn.compact
  def __call__(self, q_pos_BxQ: jax.Array, k_pos_BxK: jax.Array) -> jax.Array:
    c = self.param('c', nn.initializers.constant(self.init_c), (), jnp.float32)
    l_multiplier = self.param('L_multiplier', nn.initializers.ones, (), jnp.float32)
    w_in = self.param('w_in', initializers.torch_uniform(1), (1, self.hidden), jnp.float32)
    b_in = self.param('b_in', initializers.torch_uniform(1), (self.hidden,), jnp.float32)
    w_out = self.param('w_out', initializers.torch_uniform(self.hidden), (self.hidden, self.num_heads),
                       jnp.float32)
    b_out = self.param('b_out', initializers.torch_uniform(self.hidden), (self.num_heads,), jnp.float32)
    return fire_bias(q_pos_BxQ, k_pos_BxK, c=c, l_multiplier=l_multiplier, init_L=self.init_L,
                     w_in_1xN=w_in, b_in_N=b_in, w_out_NxH=w_out, b_out_H=b_out,
                     negative_slope=self.negative_slope)
