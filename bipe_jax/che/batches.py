"""Task batches -> padded encoder inputs, as the benchmark's encoder reads them.

A row is the input string followed by O placeholder tokens (O = the task's output length; the
placeholder id is the task's input_size, one past its symbols), and the model's outputs are
read at the placeholders (Ruoss et al.'s `make_model_with_empty_targets`). Rows of different
lengths share one padded shape [B, T_pad]: padding is marked invalid (no position, masked as a
key) and its outputs are masked, so a row's logits do not depend on how far it is padded
(tests/che/test_che.py checks it).
"""

from typing import Sequence

import numpy as np

from bipe_jax.che import segments
from bipe_jax.tasks.che import Batch
from bipe_jax.tasks.che import Task

FIELDS = ('tokens', 'valid', 'token', 'intra', 'inter', 'out_index', 'targets', 'acc_mask',
          'out_valid')


def placeholder_id(task: Task) -> int:
  return task.input_size


def vocab_size(task: Task) -> int:
  """Input symbols + the placeholder; at least the number of output classes (one head)."""
  return max(task.input_size + 1, task.output_size)


def row_length(task: Task, length: int) -> int:
  """Tokens of a row of input length `length` (input + placeholders); an upper bound where a
  task shortens even inputs (modular arithmetic)."""
  return length + task.output_length(length)


def pack(task: Task, batches: Sequence[Batch], segmentation: str, pad_to: int,
         out_pad: int) -> dict:
  """Rows of `batches` (any lengths) -> numpy arrays:
  tokens, token, intra, inter [N, pad_to] int32; valid [N, pad_to] bool;
  out_index, targets [N, out_pad] int32; acc_mask, out_valid [N, out_pad] bool
  (acc_mask: the outputs that count for accuracy; out_valid: every real output)."""
  rows = [(x, y, m) for b in batches for x, y, m in zip(b.inputs, b.targets, b.mask)]
  n = len(rows)
  out = {f: np.zeros((n, out_pad if f in ('out_index', 'targets', 'acc_mask', 'out_valid')
                      else pad_to), bool if f in ('valid', 'acc_mask', 'out_valid') else np.int32)
         for f in FIELDS}
  for r, (x, y, m) in enumerate(rows):
    length, o = len(x), len(y)
    t = length + o
    if t > pad_to or o > out_pad:
      raise ValueError(f'che.pack: a row of {t} tokens / {o} outputs does not fit '
                       f'pad_to={pad_to} / out_pad={out_pad}.')
    tokens = np.concatenate([x, np.full(o, placeholder_id(task))]).astype(np.int32)
    ends = segments.segment_ends(tokens, length, task.separator_ids, segmentation)
    intra, inter = segments.streams(ends)
    out['tokens'][r, :t] = tokens
    out['valid'][r, :t] = True
    out['token'][r, :t] = np.arange(t)
    out['intra'][r, :t], out['inter'][r, :t] = intra, inter
    out['out_index'][r, :o] = length + np.arange(o)
    out['targets'][r, :o] = y
    out['acc_mask'][r, :o] = m
    out['out_valid'][r, :o] = True
  return out
