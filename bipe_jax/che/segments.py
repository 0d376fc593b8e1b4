"""BiPE's segments on the CHE tasks, which have no sentence separators.

Modes (`segmentation`):
  none     one segment: intra = the token position, inter = 0.
  task     the task's own structure (default): a segment ends after each of the task's
           separator tokens (binary addition / multiplication: the operator; solve equation:
           '=') and after the last input token, so the output placeholders are a segment.
  fixed:K  a boundary every K tokens, whatever the tokens (BiPE's fixed-length ablation).
Every stream of a padding token is 0 (the model masks it).
"""

import numpy as np


def parse(segmentation: str) -> tuple:
  """'none' | 'task' | 'fixed:K' -> (mode, K); ValueError naming the value otherwise."""
  if segmentation in ('none', 'task'):
    return segmentation, 0
  if segmentation.startswith('fixed:'):
    k = segmentation.split(':', 1)[1]
    if k.isdigit() and int(k) > 0:
      return 'fixed', int(k)
  raise ValueError(f"segmentation={segmentation!r} is invalid: must be 'none', 'task' or "
                   f"'fixed:K' with K > 0.")


def segment_ends(tokens_T: np.ndarray, input_length: int, separator_ids: tuple,
                 segmentation: str) -> np.ndarray:
  """bool [T]: True at the last token of each segment of one unpadded row."""
  mode, k = parse(segmentation)
  t = len(tokens_T)
  ends = np.zeros(t, bool)
  if mode == 'task':
    ends[:input_length] = np.isin(tokens_T[:input_length], separator_ids)
    ends[input_length - 1] = True
  elif mode == 'fixed':
    ends[k - 1::k] = True
  return ends


def streams(ends_T: np.ndarray) -> tuple:
  """(intra, inter) int [T] of a row whose segment ends are `ends_T`."""
  t = len(ends_T)
  inter = np.concatenate([[0], np.cumsum(ends_T)[:-1]]).astype(np.int32)
  starts = np.concatenate([[True], ends_T[:-1]])
  start_index = np.maximum.accumulate(np.where(starts, np.arange(t), 0))
  return (np.arange(t) - start_index).astype(np.int32), inter
