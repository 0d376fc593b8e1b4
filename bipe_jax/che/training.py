"""Training on the uniform length curriculum (Ruoss et al. 2023): each step draws one length
uniformly from 1..max_length and a batch of that length. A batch is padded only to the smallest
bucket that holds it (`padded_shape`: its row and output lengths rounded up to a multiple of
`bucket` tokens, at most those of max_length), so the step compiles once per bucket (3 for
reverse string with the default 32: rows of 32, 64 and 80 tokens) and a short batch costs a short
step; padding changes no loss and no gradient (masked keys and outputs;
tests/che/test_train_buckets.py). Loss: cross-entropy averaged over every output position (the
benchmark's loss: padding outputs after a terminator included), Adam, gradients clipped at global
norm 1. The peer block's dropout draws from each step's key (fold_in(key, 1); the key itself
draws randomized positions); its masks have the padded shape, so a batch's dropout draw (not its
loss without dropout) depends on the bucket."""

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


TRAIN_BUCKET = 32  # training rows are padded to a multiple of this many tokens (padded_shape)


def padded_shape(task: Task, length: int, max_length: int, bucket: int = TRAIN_BUCKET) -> tuple:
  """(pad_to, out_pad) of a training batch of input length `length`: its row and output
  lengths rounded up to a multiple of `bucket`, capped at the longest of lengths 1..max_length
  (so the longest batches are not padded past their own length)."""
  if bucket < 1:
    raise ValueError(f'train bucket={bucket} must be >= 1.')
  lengths = range(1, max_length + 1)
  top_row = max(batches_lib.row_length(task, n) for n in lengths)
  top_out = max(task.output_length(n) for n in lengths)
  up = lambda n, cap: min(-(-n // bucket) * bucket, cap)
  return (up(batches_lib.row_length(task, length), top_row),
          up(task.output_length(length), top_out))


def cross_entropy(logits_NxOxC: jax.Array, targets_NxO: jax.Array, mask_NxO: jax.Array):
  logp = jax.nn.log_softmax(logits_NxOxC.astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, targets_NxO[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * mask_NxO) / jnp.maximum(jnp.sum(mask_NxO), 1)


def batch_loss(module, params, batch: dict, output_size: int, key=None):
  """The training loss of one packed batch (batches.pack). `key`: the step's key, from which
  randomized positions are drawn (when the config has them) and the peer block's dropout
  (fold_in(key, 1)); None: neither, the deterministic loss."""
  logits = che_model.output_logits(
      module, params, batch, output_size, positions_rng=key,
      dropout_rng=None if key is None else jax.random.fold_in(key, 1))
  return cross_entropy(logits, batch['targets'], batch['out_valid'])


@functools.lru_cache(maxsize=64)
def train_step(module, output_size: int, learning_rate: float):
  """(optimizer, jitted step(params, opt_state, batch, key) -> (params, opt_state, loss)) of
  one model, task output size and learning rate (one compiled program per padded shape).
  Cached (up to 64 models: every model of a grid process): the cells that differ only by seed,
  or by task with an equal model, reuse the compiled programs, whatever the grid's order."""
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate))

  @jax.jit
  def step(p, state, batch, positions_rng):
    loss, grads = jax.value_and_grad(
        lambda q: batch_loss(module, q, batch, output_size, positions_rng))(p)
    updates, state = tx.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss

  return tx, step


def train(task: Task, module, params, budget: Budget, *, seed: int, segmentation: str,
          progress: Optional[Callable[[int, float, float], None]] = None, log_every: int = 100,
          bucket: int = TRAIN_BUCKET):
  """Returns (params, losses [steps]); `progress(step, loss, seconds)` every `log_every`;
  batches padded to buckets of `bucket` tokens (padded_shape)."""
  padded_shape(task, 1, budget.max_length, bucket)  # checks the bucket
  tx, step = train_step(module, task.output_size, budget.learning_rate)
  opt_state = tx.init(params)

  rng = np.random.default_rng(seed)
  positions_key = jax.random.PRNGKey(seed)
  losses, start = [], time.perf_counter()
  for i in range(budget.steps):
    length = int(rng.integers(1, budget.max_length + 1))
    batch = batches_lib.pack(task, [task.sample(rng, budget.batch_size, length)], segmentation,
                             *padded_shape(task, length, budget.max_length, bucket))
    # randomized positions (when the model has them): step i's from fold_in(key(seed), i)
    positions_rng = jax.random.fold_in(positions_key, i)
    params, opt_state, loss = step(params, opt_state, batch, positions_rng)
    if progress is not None and ((i + 1) % log_every == 0 or i + 1 == budget.steps):
      losses.append(float(loss))
      progress(i + 1, float(loss), time.perf_counter() - start)
    else:
      losses.append(loss)
  return params, [float(x) for x in losses]
