"""How an evaluation length is scored: which targets of which windows count.

  windows       non-overlapping windows of the length, every target scored (BiPE's protocol,
                the official one; 'blocks' is the same). A sweep scores, at every length, only
                the stream positions that are targets at every length (sweep.common_targets).
  last:K        non-overlapping windows, only the last K targets of each scored (DAPE's
                protocol, K = 256): every scored token has at least length - K tokens of
                context. K >= length - 1 scores every target of the window.
  sliding:S     windows starting every S tokens, only their last S tokens scored (ALiBi-style
                papers), so every token is scored once with >= length - S tokens of context
                ('sliding' with a separate stride S is the same).

The windows are cut by the data pipeline (`cut_blocks`, with `stride(protocol)`), and
`restrict_targets` keeps the targets the protocol scores; column 0 is never a target (it has no
context inside the window), as bipe_jax/block_scoring.py expects.
"""

from __future__ import annotations

import dataclasses

import numpy as np

KINDS = ('windows', 'last', 'sliding')


@dataclasses.dataclass(frozen=True)
class Protocol:
  kind: str  # 'windows' | 'last' | 'sliding'
  k: int = 0  # last: targets scored per window; sliding: the stride

  @property
  def name(self) -> str:
    return self.kind if self.kind == 'windows' else f'{self.kind}:{self.k}'

  @property
  def same_targets_at_every_length(self) -> bool:
    """True when a sweep restricts every length to the common targets (windows only)."""
    return self.kind == 'windows'

  def check_length(self, length: int) -> None:
    if self.kind == 'sliding' and self.k >= length:
      raise ValueError(f'--protocol={self.name}: the stride {self.k} must be smaller than the '
                       f'length {length}')


def parse(text: str, stride: int | None = None) -> Protocol:
  """'windows' | 'blocks' | 'last:K' | 'sliding:S' | 'sliding' (with `stride`) -> Protocol;
  ValueError naming the value otherwise."""
  text = str(text).strip()
  kind, _, value = text.partition(':')
  if text in ('windows', 'blocks'):
    return Protocol('windows')
  if text == 'sliding' and stride:
    value, kind = str(stride), 'sliding'
  if kind in ('last', 'sliding') and value.isdigit() and int(value) > 0:
    return Protocol(kind, int(value))
  raise ValueError(f'--protocol={text!r} is not valid: allowed windows, last:K or sliding:STRIDE '
                   '(K, STRIDE positive integers; e.g. last:256, sliding:128)')


def stride(protocol: Protocol) -> int | None:
  """The window stride of the data pipeline's `cut_blocks` (None: non-overlapping windows)."""
  return protocol.k if protocol.kind == 'sliding' else None


def restrict_targets(mask_NxL: np.ndarray, protocol: Protocol) -> np.ndarray:
  """The target mask [N, L] of windows cut by `cut_blocks(..., stride=stride(protocol))`,
  restricted to what the protocol scores (last:K: the last K columns)."""
  mask_NxL = np.asarray(mask_NxL, bool)
  if protocol.kind != 'last':
    return mask_NxL
  length = mask_NxL.shape[1]
  return mask_NxL & (np.arange(length) >= length - protocol.k)[None, :]
