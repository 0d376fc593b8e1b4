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

  @property
  def nll(self) -> float:
    """Mean NLL per scored token (nats)."""
    return self.nll_sum / self.tokens if self.tokens else float('nan')

  @property
  def perplexity(self) -> float:
    return math.exp(self.nll) if self.tokens else float('nan')

  def to_dict(self) -> dict:
    return dict(length=self.length, blocks=self.blocks, tokens=self.tokens,
                nll_sum=self.nll_sum, nll=self.nll, perplexity=self.perplexity)


def block_nll(logits_BxLxV: jax.Array, tokens_BxL: jax.Array,
              target_mask_BxL: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(summed NLL float32 [], scored-token count int32 []) of the masked next-token targets."""
  logits = logits_BxLxV[:, :-1].astype(jnp.float32)
  targets = tokens_BxL[:, 1:]
  mask = target_mask_BxL[:, 1:]
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = jax.nn.logsumexp(logits, axis=-1) - target_logit
  return jnp.sum(jnp.where(mask, nll, 0.0)), jnp.sum(mask.astype(jnp.int32))


def _batch_axes(mesh: Mesh | None, axes: Sequence[str]) -> tuple[str, ...]:
  if mesh is None:
    return ()
  return tuple(a for a in axes if a in mesh.shape)


def _shards(mesh: Mesh | None, axes: tuple[str, ...]) -> int:
  return int(np.prod([mesh.shape[a] for a in axes])) if axes else 1


def make_batch_scorer(apply_fn: ApplyFn, mesh: Mesh | None = None,
                      batch_axes: Sequence[str] = ('data', 'fsdp')):
  """jitted (params, tokens_BxL, mask_BxL) -> (nll_sum, count), batch sharded over the mesh."""
  axes = _batch_axes(mesh, batch_axes)

  def scorer(params, tokens, mask):
    if axes:
      spec = NamedSharding(mesh, P(axes, None))
      tokens = jax.lax.with_sharding_constraint(tokens, spec)
      mask = jax.lax.with_sharding_constraint(mask, spec)
    return block_nll(apply_fn(params, tokens), tokens, mask)

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
                 progress: Callable[[int], None] | None = None) -> LengthResult:
  """Summed NLL and scored-token count over all blocks.

  Args:
    apply_fn: (params, tokens [B, L] int32) -> logits [B, L, V].
    params: the model parameters (placed/sharded as the caller wants).
    tokens_NxL: int32 blocks; target_mask_NxL: bool, which tokens are scored (column 0 ignored).
    batch_size: blocks per forward; rounded up to a multiple of the mesh's batch shards.
    mesh: optional device mesh; the batch is sharded over `batch_axes` found in it.
    scorer: a `make_batch_scorer(...)` result to reuse across calls (saves re-tracing).
    progress: called with the number of blocks finished after each batch.
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
  scorer = scorer or make_batch_scorer(apply_fn, mesh, batch_axes)
  total_nll, total_count = 0.0, 0
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
      total_nll += float(nll)
      total_count += int(count)
      if progress:
        progress(done)
  for done, (nll, count) in pending:
    total_nll += float(nll)
    total_count += int(count)
    if progress:
      progress(done)
  return LengthResult(length=length, blocks=num_blocks, tokens=total_count, nll_sum=total_nll)
