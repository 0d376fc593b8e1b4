"""Validation loss during training (`train.eval_every`): a fixed slice, one compiled scorer.

The slice is the first `train.eval_tokens` tokens of the validation split's evaluation stream
(bipe_jax.data.make_eval_blocks: documents in stored order, each with BOS) cut into
non-overlapping blocks of `data.seq_len`, so every measurement of a run scores exactly the same
targets and the numbers are comparable along the run (and with `eval/perplexity.py` at the
training length on the same tokens). The scorer (bipe_jax.block_scoring) shards the
blocks over the mesh's batch axes like training and is traced once.
"""

from __future__ import annotations

import dataclasses

import numpy as np


class ValidationSliceError(ValueError):
  """The validation slice cannot be built (missing split, too few tokens): names the field."""


@dataclasses.dataclass
class ValidationSlice:
  tokens_NxL: np.ndarray  # int32 blocks of seq_len
  mask_NxL: np.ndarray  # bool: scored targets
  batch_size: int
  _scorer: object = None

  @property
  def targets(self) -> int:
    return int(self.mask_NxL[:, 1:].sum())

  def evaluate(self, model, params, mesh) -> tuple[float, int]:
    """(mean NLL per scored target, targets scored). Call inside the trainer's mesh context."""
    from bipe_jax import block_scoring as perplexity  # pylint: disable=g-import-not-at-top
    if self._scorer is None:
      self._scorer = perplexity.make_batch_scorer(
          lambda p, tokens: model.apply({'params': p}, tokens), mesh)
    result = perplexity.score_blocks(None, params, self.tokens_NxL, self.mask_NxL,
                                     batch_size=self.batch_size, mesh=mesh,
                                     scorer=self._scorer)
    return result.nll, result.tokens


def make_validation_slice(config) -> ValidationSlice | None:
  """The slice for `config` (None when train.eval_every is 0)."""
  t = config.train
  if not int(t.eval_every):
    return None
  from bipe_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  seq_len = int(config.data.seq_len)
  eval_tokens = int(t.eval_tokens)
  if eval_tokens < seq_len:
    raise ValidationSliceError(f'train.eval_tokens={eval_tokens} is invalid: must be at least '
                               f'data.seq_len={seq_len} (one block)')
  try:
    tokens, mask = data_lib.make_eval_blocks(config.data, seq_len, max_tokens=eval_tokens)
  except ValueError as e:
    raise ValidationSliceError(f'train.eval_every={t.eval_every}: cannot build the validation '
                               f'slice: {" ".join(str(e).split())}') from None
  return ValidationSlice(tokens, mask, batch_size=int(t.batch_size))
