"""Per-length accuracy and the benchmark's score.

A length's accuracy pools its rows as the benchmark's `accuracy_fn`: the fraction of correct
outputs among those that count (base.Task.accuracy_mask). The score is the mean accuracy over
the scored lengths 41..500 (Ruoss et al. report the mean over every length 41..500; a run that
scores a subset says which: `lengths` is written beside the numbers).

Compiles: rows are padded to a bucket of `bucket` tokens (and outputs to a bucket of `bucket`
outputs), and rows of every length of a bucket share calls of `rows_per_call` rows, so the
number of programs is the number of buckets, not of lengths. Padding changes no logit
(batches.py; tests/che/test_che.py).
"""

import functools
import math
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax.che import batches as batches_lib
from bipe_jax.che import model as che_model
from bipe_jax.tasks.che import Task

TEST_RANGE = (41, 500)


def parse_lengths(spec: str) -> tuple:
  """'1-40,41-500:10,500' -> the sorted lengths (a-b inclusive, :s a step)."""
  out = set()
  for part in spec.split(','):
    part = part.strip()
    try:
      span, _, step = part.partition(':')
      lo, _, hi = span.partition('-')
      lo, hi, step = int(lo), int(hi or lo), int(step or 1)
      if lo < 1 or hi < lo or step < 1:
        raise ValueError
    except ValueError:
      raise ValueError(f'lengths: {part!r} in {spec!r} is not N, A-B or A-B:STEP '
                       f'(1 <= A <= B, STEP >= 1).') from None
    out.update(range(lo, hi + 1, step))
  return tuple(sorted(out))


def _round_up(n: int, bucket: int) -> int:
  return int(math.ceil(n / bucket) * bucket)


@functools.lru_cache(maxsize=64)
def _predict(module, output_size: int):
  """jitted (params, batch) -> argmax outputs [N, O]; cached per model (its programs are
  reused by the next seed's scoring)."""
  return jax.jit(lambda p, b, key: jnp.argmax(
      che_model.output_logits(module, p, b, output_size, positions_rng=key), -1))


def per_length_accuracy(task: Task, module, params, lengths: Sequence[int], *, samples: int,
                        seed: int, segmentation: str, bucket: int = 64,
                        rows_per_call: int = 32) -> dict:
  """{length: accuracy}. Each length's rows come from np.random.default_rng([seed, length]),
  so they do not depend on the bucketing or on the other lengths (randomized positions, when
  the model has them, do: their key is the call's)."""
  predict = _predict(module, task.output_size)
  groups = {}
  for n in lengths:
    key = (_round_up(batches_lib.row_length(task, n), bucket),
           _round_up(task.output_length(n), bucket))
    groups.setdefault(key, []).append(n)
  correct, counted = {}, {}
  for (pad_to, out_pad), group in sorted(groups.items()):
    rows, owners = [], []
    for n in group:
      b = task.sample(np.random.default_rng([seed, n]), samples, n)
      rows.append(b)
      owners += [n] * samples
    packed = batches_lib.pack(task, rows, segmentation, pad_to, out_pad)
    owners = np.asarray(owners)
    for start in range(0, len(owners), rows_per_call):
      chunk = {k: v[start:start + rows_per_call] for k, v in packed.items()}
      real = len(chunk['tokens'])
      if real < rows_per_call:  # pad with empty rows: one program per bucket
        chunk = {k: np.concatenate([v, np.zeros((rows_per_call - real,) + v.shape[1:], v.dtype)])
                 for k, v in chunk.items()}
      # randomized positions (when the model has them), drawn as in training (the benchmark
      # draws them at evaluation too), from a key fixed by (seed, bucket, first row)
      key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), pad_to), start)
      pred = np.asarray(predict(params, chunk, key))[:real]
      ok = (pred == chunk['targets'][:real]) & chunk['acc_mask'][:real]
      for n in np.unique(owners[start:start + real]):
        rows_n = owners[start:start + real] == n
        correct[int(n)] = correct.get(int(n), 0) + int(ok[rows_n].sum())
        counted[int(n)] = counted.get(int(n), 0) + int(chunk['acc_mask'][:real][rows_n].sum())
  return {n: correct[n] / counted[n] for n in sorted(correct)}


def mean_over(accuracy: dict, lo: int, hi: int) -> float:
  """Mean accuracy over the scored lengths in [lo, hi] (nan if none)."""
  values = [a for n, a in accuracy.items() if lo <= n <= hi]
  return float(np.mean(values)) if values else float('nan')


def score(accuracy: dict) -> float:
  """The benchmark's score: the mean over the scored lengths of 41..500."""
  return mean_over(accuracy, *TEST_RANGE)


def describe(lengths: Iterable[int]) -> str:
  lengths = sorted(lengths)
  test = [n for n in lengths if TEST_RANGE[0] <= n <= TEST_RANGE[1]]
  full = len(test) == TEST_RANGE[1] - TEST_RANGE[0] + 1
  return ('every length 41..500' if full else
          f'{len(test)} of the 460 lengths 41..500 ({test[0] if test else "-"}..'
          f'{test[-1] if test else "-"})')
