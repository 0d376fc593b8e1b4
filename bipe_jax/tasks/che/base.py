"""The common shape of a Chomsky-hierarchy task (Deletang et al. 2023; Ruoss et al. 2023).

A task maps an input string of `length` symbols (ids 0..input_size-1) to an output string of
`output_length(length)` symbols (ids 0..output_size-1). A batch is drawn from a seeded
`np.random.Generator`, so the same seed gives the same batch at any length.

Which outputs count for accuracy: every output position, except for the tasks whose output ends
with a termination token (`terminator` set: stack manipulation, binary addition, binary
multiplication), where only the positions up to and including the first terminator count (the
rest is zero padding), as the benchmark's `accuracy_mask`.
"""

import dataclasses
from typing import Callable, Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class Batch:
  """inputs [B, L_in] int32 (L_in = length, or length - 1 where a task forces odd lengths),
  targets [B, O] int32, mask [B, O] bool (the outputs that count for accuracy)."""
  inputs: np.ndarray
  targets: np.ndarray
  mask: np.ndarray


@dataclasses.dataclass(frozen=True)
class Task:
  """One task: `sample(rng, batch_size, length) -> (inputs [B, L_in], targets [B, O])`.

  `answer(input_row) -> output_row` is the task's function on one input (used by `sample` where
  the answer is not a by-product of the generation, and checked against it otherwise).
  `separator_ids`: input ids that end a segment in the task's own structure (BiPE's 'task'
  segmentation), e.g. the operator between two binary numbers.
  """
  name: str
  level: str  # 'regular' | 'dcf' | 'cs'
  input_size: int
  output_size: int
  output_length: Callable[[int], int]
  sample_fn: Callable[[np.random.Generator, int, int], tuple]
  answer: Callable[[np.ndarray], np.ndarray]
  terminator: Optional[int] = None
  separator_ids: tuple = ()

  def sample(self, rng: np.random.Generator, batch_size: int, length: int) -> Batch:
    if length < 1:
      raise ValueError(f'task {self.name}: length must be >= 1, got {length}.')
    inputs, targets = self.sample_fn(rng, batch_size, length)
    inputs = np.asarray(inputs, np.int32).reshape(batch_size, -1)
    targets = np.asarray(targets, np.int32).reshape(batch_size, -1)
    if targets.shape[1] != self.output_length(length):
      raise AssertionError(f'task {self.name}: {targets.shape[1]} outputs at length {length}, '
                           f'expected {self.output_length(length)}.')
    return Batch(inputs, targets, self.accuracy_mask(targets))

  def accuracy_mask(self, targets_BxO: np.ndarray) -> np.ndarray:
    """bool [B, O]: all True, or up to and including the first terminator of each row."""
    if self.terminator is None:
      return np.ones(targets_BxO.shape, bool)
    first = np.argmax(targets_BxO == self.terminator, axis=1)  # every row has one
    return np.arange(targets_BxO.shape[1])[None, :] <= first[:, None]


def one(length: int) -> int:
  del length
  return 1


def random_bits(rng: np.random.Generator, n: int) -> np.ndarray:
  """n uniform random bits, not all zero (the binary digits of a uniform integer in
  [1, 2^n - 1], in any fixed digit order); [] for n = 0."""
  if n == 0:
    return np.zeros((0,), np.int64)
  while True:
    bits = rng.integers(0, 2, size=n)
    if bits.any():
      return bits


def batch_of(rows: list) -> np.ndarray:
  return np.asarray(rows, np.int32).reshape(len(rows), -1)
