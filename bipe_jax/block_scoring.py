"""Scoring a language model over blocks of tokens with a target mask (summed NLL, perplexity).

Used by evaluation (bipe_jax/evaluation/perplexity.py) and by the trainer's validation
(bipe_jax/training/validation.py), below both.

Convention (the data pipeline's `make_eval_blocks`): `target_mask_NxL[n, t]` is True when token
`t` of block `n` is scored, predicted from the logits at position `t - 1`; column 0 cannot be
predicted inside a block and is ignored. The official protocol scores every target of
non-overlapping blocks (L - 1 per block); the sliding-window protocol scores only the last
`stride` tokens of each window.

`score_blocks` is a pure function of (apply function, params, arrays): it runs fixed-shape
batches through one jitted function (the last batch is padded with unscored rows), shards the
batch over the mesh's data axes like training, and accumulates the summed NLL in float64 on the
host. Perplexity = exp(summed NLL / tokens scored).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

ApplyFn = Callable[..., jax.Array]  # apply_fn(params, tokens_BxL) -> logits [B, L, V]


@dataclasses.dataclass(frozen=True)
class LengthResult:
  """Score of one evaluation length."""
  length: int
  blocks: int
  tokens: int  # targets scored
  nll_sum: float
  # With per_position scoring: summed NLL and scored-target count at each window position
  # t = 0..L-1 (the target predicted from position t - 1; t = 0 is never scored). None if not.
  position_nll_sum: tuple | None = None
  position_tokens: tuple | None = None

  @property
  def nll(self) -> float:
    """Mean NLL per scored token (nats)."""
    return self.nll_sum / self.tokens if self.tokens else float('nan')

  @property
  def perplexity(self) -> float:
    return math.exp(self.nll) if self.tokens else float('nan')

  @property
  def position_nll(self) -> list | None:
    """Mean NLL at each window position [L] (None where nothing was scored there)."""
    if self.position_nll_sum is None:
      return None
    return [s / c if c else None for s, c in zip(self.position_nll_sum, self.position_tokens)]

  def to_dict(self) -> dict:
    out = dict(length=self.length, blocks=self.blocks, tokens=self.tokens,
               nll_sum=self.nll_sum, nll=self.nll, perplexity=self.perplexity)
    if self.position_nll_sum is not None:
      out.update(position_nll=self.position_nll, position_tokens=list(self.position_tokens))
    return out


def block_nll(logits_BxLxV: jax.Array, tokens_BxL: jax.Array,
              target_mask_BxL: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(summed NLL float32 [], scored-token count int32 []) of the masked next-token targets."""
  logits = logits_BxLxV[:, :-1].astype(jnp.float32)
  targets = tokens_BxL[:, 1:]
  mask = target_mask_BxL[:, 1:]
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = jax.nn.logsumexp(logits, axis=-1) - target_logit
  return jnp.sum(jnp.where(mask, nll, 0.0)), jnp.sum(mask.astype(jnp.int32))


def position_nll(logits_BxLxV: jax.Array, tokens_BxL: jax.Array,
                 target_mask_BxL: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(summed NLL float32 [L], scored-target count int32 [L]) at each window position t (the
  target tokens[:, t] predicted from the logits at t - 1; position 0 is never scored)."""
  logits = logits_BxLxV[:, :-1].astype(jnp.float32)
  targets = tokens_BxL[:, 1:]
  mask = target_mask_BxL[:, 1:]
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = jax.nn.logsumexp(logits, axis=-1) - target_logit
  zero = lambda x: jnp.concatenate([jnp.zeros((1,), x.dtype), x])
  return (zero(jnp.sum(jnp.where(mask, nll, 0.0), axis=0)),
          zero(jnp.sum(mask.astype(jnp.int32), axis=0)))


def _batch_axes(mesh: Mesh | None, axes: Sequence[str]) -> tuple[str, ...]:
  if mesh is None:
    return ()
  return tuple(a for a in axes if a in mesh.shape)


def _shards(mesh: Mesh | None, axes: tuple[str, ...]) -> int:
  return int(np.prod([mesh.shape[a] for a in axes])) if axes else 1


def make_batch_scorer(apply_fn: ApplyFn, mesh: Mesh | None = None,
                      batch_axes: Sequence[str] = ('data', 'fsdp'), per_position: bool = False):
  """jitted (params, tokens_BxL, mask_BxL) -> (nll_sum, count), batch sharded over the mesh;
  with `per_position`, both [L] (`position_nll`)."""
  reduce = position_nll if per_position else block_nll
  axes = _batch_axes(mesh, batch_axes)

  def scorer(params, tokens, mask):
    if axes:
      spec = NamedSharding(mesh, P(axes, None))
      tokens = jax.lax.with_sharding_constraint(tokens, spec)
      mask = jax.lax.with_sharding_constraint(mask, spec)
    return reduce(apply_fn(params, tokens), tokens, mask)

  return jax.jit(scorer)


def _to_global(mesh: Mesh | None, axes: tuple[str, ...], rows: np.ndarray) -> jax.Array:
  """Host rows [B, L] (identical on every process) -> a jax.Array sharded on the batch axes."""
  if not axes:
    return jnp.asarray(rows)
  sharding = NamedSharding(mesh, P(axes, None))
  return jax.make_array_from_callback(rows.shape, sharding, lambda index: rows[index])


def score_blocks(apply_fn: ApplyFn, params, tokens_NxL: np.ndarray, target_mask_NxL: np.ndarray,
                 *, batch_size: int = 8, mesh: Mesh | None = None,
                 batch_axes: Sequence[str] = ('data', 'fsdp'), scorer=None,
                 progress: Callable[[int], None] | None = None,
                 per_position: bool = False) -> LengthResult:
  """Summed NLL and scored-token count over all blocks.

  Args:
    apply_fn: (params, tokens [B, L] int32) -> logits [B, L, V].
    params: the model parameters (placed/sharded as the caller wants).
    tokens_NxL: int32 blocks; target_mask_NxL: bool, which tokens are scored (column 0 ignored).
    batch_size: blocks per forward; rounded up to a multiple of the mesh's batch shards.
    mesh: optional device mesh; the batch is sharded over `batch_axes` found in it.
    scorer: a `make_batch_scorer(...)` result to reuse across calls (saves re-tracing).
    progress: called with the number of blocks finished after each batch.
    per_position: also sum the NLL per window position (LengthResult.position_nll); a given
      `scorer` must then be made with per_position=True.
  """
  tokens_NxL = np.asarray(tokens_NxL)
  target_mask_NxL = np.asarray(target_mask_NxL)
  if tokens_NxL.ndim != 2 or tokens_NxL.shape != target_mask_NxL.shape:
    raise ValueError(f'tokens {tokens_NxL.shape} and target_mask {target_mask_NxL.shape} must be '
                     'the same [N, L] shape')
  num_blocks, length = tokens_NxL.shape
  if num_blocks == 0:
    raise ValueError(f'no blocks to score at length {length}')
  if batch_size < 1:
    raise ValueError(f'batch_size={batch_size}: must be >= 1')
  axes = _batch_axes(mesh, batch_axes)
  shards = _shards(mesh, axes)
  batch_size = min(batch_size, num_blocks)
  batch_size = -(-batch_size // shards) * shards
  scorer = scorer or make_batch_scorer(apply_fn, mesh, batch_axes, per_position)
  total_nll, total_count = np.float64(0.0), np.int64(0)  # [L] arrays with per_position
  pending = []  # dispatch every batch before fetching results (async dispatch)
  for start in range(0, num_blocks, batch_size):
    rows = tokens_NxL[start:start + batch_size].astype(np.int32)
    mask = target_mask_NxL[start:start + batch_size].astype(bool)
    if rows.shape[0] < batch_size:  # pad with unscored rows: one compiled shape
      pad = batch_size - rows.shape[0]
      rows = np.concatenate([rows, np.zeros((pad, length), np.int32)])
      mask = np.concatenate([mask, np.zeros((pad, length), bool)])
    pending.append((min(start + batch_size, num_blocks),
                    scorer(params, _to_global(mesh, axes, rows), _to_global(mesh, axes, mask))))
    if len(pending) > 1:
      done, (nll, count) = pending.pop(0)
      total_nll = total_nll + np.asarray(nll, np.float64)
      total_count = total_count + np.asarray(count, np.int64)
      if progress:
        progress(done)
  for done, (nll, count) in pending:
    total_nll = total_nll + np.asarray(nll, np.float64)
    total_count = total_count + np.asarray(count, np.int64)
    if progress:
      progress(done)
  if not per_position:
    return LengthResult(length=length, blocks=num_blocks, tokens=int(total_count),
                        nll_sum=float(total_nll))
  return LengthResult(length=length, blocks=num_blocks, tokens=int(total_count.sum()),
                      nll_sum=float(total_nll.sum()),
                      position_nll_sum=tuple(float(x) for x in total_nll),
                      position_tokens=tuple(int(x) for x in total_count))
