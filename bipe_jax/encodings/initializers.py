"""Parameter initialisers shared by the learned encodings."""

import jax
import jax.numpy as jnp


def torch_uniform(fan_in: int):
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default nn.Linear / nn.Conv init (weights and
  bias), so modules ported from the official PyTorch code start from the same distribution."""
  bound = fan_in**-0.5

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init
