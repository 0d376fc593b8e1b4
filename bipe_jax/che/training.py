"""Training on the uniform length curriculum (Ruoss et al. 2023): each step draws one length
uniformly from 1..max_length and a batch of that length; every batch is padded to the row
length of max_length, so the step compiles once. Loss: cross-entropy averaged over every output
position (the benchmark's loss: padding outputs after a terminator included), Adam, gradients
clipped at global norm 1."""

import dataclasses
import functools
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bipe_jax.che import batches as batches_lib
from bipe_jax.che import model as che_model
from bipe_jax.tasks.che import Task


@dataclasses.dataclass(frozen=True)
class Budget:
  """The training budget of a cell (fixed before any cell of a grid is trained)."""
  steps: int = 2000
  batch_size: int = 32
  learning_rate: float = 1e-3
  max_length: int = che_model.TRAIN_MAX_LENGTH


def cross_entropy(logits_NxOxC: jax.Array, targets_NxO: jax.Array, mask_NxO: jax.Array):
  logp = jax.nn.log_softmax(logits_NxOxC.astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, targets_NxO[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * mask_NxO) / jnp.maximum(jnp.sum(mask_NxO), 1)


@functools.lru_cache(maxsize=4)
def train_step(module, output_size: int, learning_rate: float):
  """(optimizer, jitted step(params, opt_state, batch) -> (params, opt_state, loss)) of one
  model, task output size and learning rate. Cached: the cells of a grid that differ only by
  seed (or task with the same sizes) reuse one compiled program."""
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate))

  def loss_fn(p, batch):
    logits = che_model.output_logits(module, p, batch, output_size)
    return cross_entropy(logits, batch['targets'], batch['out_valid'])

  @jax.jit
  def step(p, state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(p, batch)
    updates, state = tx.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss

  return tx, step


def train(task: Task, module, params, budget: Budget, *, seed: int, segmentation: str,
          progress: Optional[Callable[[int, float, float], None]] = None, log_every: int = 100):
  """Returns (params, losses [steps]); `progress(step, loss, seconds)` every `log_every`."""
  lengths = range(1, budget.max_length + 1)
  pad_to = max(batches_lib.row_length(task, n) for n in lengths)
  out_pad = max(task.output_length(n) for n in lengths)
  tx, step = train_step(module, task.output_size, budget.learning_rate)
  opt_state = tx.init(params)

  rng = np.random.default_rng(seed)
  losses, start = [], time.perf_counter()
  for i in range(budget.steps):
    length = int(rng.integers(1, budget.max_length + 1))
    batch = batches_lib.pack(task, [task.sample(rng, budget.batch_size, length)], segmentation,
                             pad_to, out_pad)
    params, opt_state, loss = step(params, opt_state, batch)
    if progress is not None and ((i + 1) % log_every == 0 or i + 1 == budget.steps):
      losses.append(float(loss))
      progress(i + 1, float(loss), time.perf_counter() - start)
    else:
      losses.append(loss)
  return params, [float(x) for x in losses]
