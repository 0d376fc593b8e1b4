"""Parameter initialisers shared by the learned encodings."""

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def torch_uniform(fan_in: int):
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default nn.Linear / nn.Conv init (weights and
  bias), so modules ported from the official PyTorch code start from the same distribution."""
  bound = fan_in**-0.5

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def logically_partitioned(init: Callable, names: tuple) -> Callable:
  """`init`, whose parameter carries logical-axis `names` (nn.LogicallyPartitioned, read by
  `nn.get_partition_spec`) when a mesh is set (`jax.set_mesh`), and is a plain array otherwise.

  Sharded training initialises under its mesh (bipe_jax/state/train_state.py), so it sees the
  names; without a mesh there is nothing to shard over, and plain arrays let a model be used
  anywhere, e.g. wrapped for Flax NNX by `nnx.bridge.ToNNX` (whose variables would otherwise
  ask for a mesh to place the named axes on).
  """
  boxed = nn.with_logical_partitioning(init, names)

  def init_fn(*args, **kwargs):
    if jax.sharding.get_abstract_mesh().empty:
      return init(*args, **kwargs)
    return boxed(*args, **kwargs)
  return init_fn
