"""The loss and one jit-compiled, sharded training step (with optional grad accumulation)."""

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from bipe_jax import model as model_lib
from bipe_jax.training import chunked_loss
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer as optimizer_lib
from bipe_jax.state.train_state import TrainState


@jax.custom_vjp
def token_nll(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
  """-log softmax(logits)[target], float32 [B, T]. Its gradient is written as one expression,
  (softmax - one_hot) * g, which XLA fuses into a single pass over the [B, T, V] logits (the
  automatic one adds the logsumexp and the gather paths in a separate pass)."""
  return _token_nll_fwd(logits_BxTxV, targets_BxT)[0]


def _token_nll_fwd(logits, targets):
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  return log_z - target_logit, (logits, log_z, targets)


def _token_nll_bwd(residuals, g_BxT):
  logits, log_z, targets = residuals
  hit = jnp.arange(logits.shape[-1]) == targets[..., None]
  grad = (jnp.exp(logits - log_z[..., None]) - hit) * g_BxT[..., None]
  return grad.astype(logits.dtype), None


token_nll.defvjp(_token_nll_fwd, _token_nll_bwd)


def next_token_nll(logits_BxTxV: jax.Array, tokens_BxT: jax.Array,
                   pad_id: int = -1, loss_mask_BxT=None) -> tuple[jax.Array, jax.Array]:
  """(sum of NLL, number of scored targets), float32.

  Targets are tokens[:, 1:], predicted from logits[:, :-1]; a target equal to `pad_id`
  (when pad_id >= 0) is not scored, nor one whose `loss_mask_BxT` entry is False (e.g. the
  input part of an input -> output example: only the output is learned). The mean loss is sum / count. Computed over all T
  positions against the tokens rolled by one, with the last column masked: slicing
  logits[:, :-1] instead copies the [B, T, V] logits forward and pads their gradient backward
  (9% of the tiny preset's step, benchmarks/README.md).
  """
  logits = logits_BxTxV.astype(jnp.float32)
  targets, valid = scored_targets(tokens_BxT, pad_id, loss_mask_BxT)
  nll = token_nll(logits, targets)
  return jnp.sum(jnp.where(valid, nll, 0.0)), jnp.sum(valid).astype(jnp.float32)


def scored_targets(tokens_BxT: jax.Array, pad_id: int = -1,
                   loss_mask_BxT=None) -> tuple[jax.Array, jax.Array]:
  """(targets [B, T] = tokens rolled left by one, valid [B, T] bool): which positions the
  next-token loss scores (not the last column, not a pad target, not a masked-out target)."""
  targets = jnp.roll(tokens_BxT, -1, axis=1)
  valid = jnp.arange(tokens_BxT.shape[1])[None, :] < tokens_BxT.shape[1] - 1
  if pad_id >= 0:
    valid = valid & (targets != pad_id)
  if loss_mask_BxT is not None:
    valid = valid & jnp.roll(loss_mask_BxT.astype(bool), -1, axis=1)
  return targets, jnp.broadcast_to(valid, targets.shape)


def train_step(state: TrainState, batch: dict, *, model: nn.Module,
               tx: optax.GradientTransformation, schedule: Callable, grad_accum_steps: int = 1,
               pad_id: int = -1, loss_chunk_tokens: int,
               batch_shards: int = 1) -> tuple[TrainState, dict]:
  """One optimizer update on a global batch {'tokens': int32 [B, T], 'loss_mask'?: [B, T]}.

  With grad_accum_steps = A > 1 the batch is split into A micro-batches (rows r with
  r % A == j form micro-batch j, so each stays spread over all data shards) and the summed
  gradients of a lax.scan are divided by the total target count: the update equals the
  A = 1 update up to float rounding.

  loss_chunk_tokens > 0 applies the lm head and the loss together in chunks of at most that
  many positions per batch shard (`batch_shards` of them; training/chunked_loss.py): no
  [B, T, V] logits, same loss and gradients up to float rounding. 0 = the model's logits.
  """
  batch = {k: v for k, v in batch.items() if k in ('tokens', 'loss_mask')}
  # Randomized positions (model.randomized_positions): drawn from fold_in(state.rng, step), and
  # micro-batch j of an accumulated step from fold_in of that key and j; the same step draws the
  # same positions, so a resumed run repeats them exactly.
  step_rng = jax.random.fold_in(state.rng, state.step)
  randomize = bool(getattr(getattr(model, 'config', None), 'randomized_positions', 0))

  def apply(params, tokens_bxT, micro_rng, **kwargs):
    if randomize:
      kwargs.update(positions_rng=micro_rng)
    return model.apply({'params': params}, tokens_bxT, **kwargs)

  def loss_sum(params, micro_batch, micro_rng=step_rng):
    tokens_bxT = micro_batch['tokens']
    if not loss_chunk_tokens:
      logits = apply(params, tokens_bxT, micro_rng)
      return next_token_nll(logits, tokens_bxT, pad_id, micro_batch.get('loss_mask'))
    hidden = apply(params, tokens_bxT, micro_rng, return_hidden=True)
    targets, valid = scored_targets(tokens_bxT, pad_id, micro_batch.get('loss_mask'))
    b, t = tokens_bxT.shape
    tc = chunked_loss.chunk_length(max(1, b // batch_shards), t, loss_chunk_tokens)
    nll_sum = chunked_loss.lm_head_nll_sum(
        hidden, params['lm_head']['kernel'], targets, valid.astype(jnp.float32), tc,
        model.config.compute_dtype, model.config.kernels)
    return nll_sum, jnp.sum(valid).astype(jnp.float32)

  grad_fn = jax.value_and_grad(loss_sum, has_aux=True)
  if grad_accum_steps == 1:
    (nll_sum, count), grads = grad_fn(state.params, batch)
  else:
    a = grad_accum_steps
    split = lambda x: jax.lax.with_sharding_constraint(  # pylint: disable=g-long-lambda
        x.reshape(x.shape[0] // a, a, x.shape[1]).swapaxes(0, 1),
        P(None, mesh_lib.BATCH_AXES, mesh_lib.CONTEXT_AXIS))
    micro = jax.tree.map(split, batch)

    def body(carry, micro):
      micro_batch, j = micro
      (nll_i, count_i), grads_i = grad_fn(state.params, micro_batch,
                                          jax.random.fold_in(step_rng, j))
      acc_grads, acc_nll, acc_count = carry
      return (jax.tree.map(jnp.add, acc_grads, grads_i), acc_nll + nll_i,
              acc_count + count_i), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (grads, nll_sum, count), _ = jax.lax.scan(
        body, (zeros, jnp.float32(0), jnp.float32(0)), (micro, jnp.arange(a)))
  denom = jnp.maximum(count, 1.0)
  grads = jax.tree.map(lambda g: g / denom, grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optimizer_lib.project_parameters(optax.apply_updates(state.params, updates))
  metrics = {'loss': nll_sum / denom, 'grad_norm': optax.global_norm(grads),
             'learning_rate': schedule(state.step), 'targets': count}
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, metrics


def make_train_step(model, tx, schedule, mesh, shardings: TrainState, *,
                    loss_chunk_tokens: int, grad_accum_steps: int = 1, pad_id: int = -1):
  """The jitted step: in/out shardings on `mesh`, the incoming state donated.

  Call it inside `train_state.mesh_context(mesh)` (the model's logical constraints need the
  mesh and the rules while tracing). `loss_chunk_tokens` (config.train's; 0 = the plain
  logits, no chunks) applies to bipe_jax's Transformer; any
  other model (one that only returns logits) gets the plain loss.
  """
  if not isinstance(model, model_lib.Transformer):
    loss_chunk_tokens = 0
  fn = functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                         grad_accum_steps=grad_accum_steps, pad_id=pad_id,
                         loss_chunk_tokens=loss_chunk_tokens,
                         batch_shards=mesh_lib.batch_shards(mesh))
  return jax.jit(fn, in_shardings=(shardings, mesh_lib.batch_sharding(mesh)),
                 out_shardings=(shardings, mesh_lib.replicated(mesh)), donate_argnums=0)
