"""Regular tasks: even pairs, modular arithmetic, parity check, cycle navigation.

Each has one output (class) per input string.
  even_pairs          bits -> 1 if the number of '01' and '10' pairs is odd, else 0.
  modular_arithmetic  d op d op ... d (digits 0..4 = ids 0..4, + - * = ids 5 6 7; id 8, the
                      benchmark's unused blank '_', is in the vocabulary but never drawn) ->
                      the value mod 5 with the usual precedence. Lengths are odd: an even
                      length L draws L - 1 symbols, as the benchmark.
  parity_check        bits -> number of ones mod 2.
  cycle_navigation    actions 0 (left), 1 (stay), 2 (right) -> the final position on a cycle
                      of 5 states starting at 0: sum(a - 1) mod 5.
"""

import numpy as np

from bipe_jax.tasks.che import base
from bipe_jax.tasks.che import expressions

MODULUS = 5
ARITHMETIC_OPS = ('+', '-', '*')  # ids MODULUS + 0, 1, 2; MODULUS + 3 is the blank '_'
CYCLE_LENGTH = 5


def _random_ints(high: int):
  def sample(rng, batch_size, length):
    return rng.integers(0, high, size=(batch_size, length))
  return sample


def _with_answers(draw, answer):
  def sample(rng, batch_size, length):
    inputs = np.asarray(draw(rng, batch_size, length))
    return inputs, base.batch_of([answer(row) for row in inputs])
  return sample


def even_pairs_answer(bits: np.ndarray) -> np.ndarray:
  return np.array([int(np.sum(bits[1:] != bits[:-1]) % 2)])


def parity_answer(bits: np.ndarray) -> np.ndarray:
  return np.array([int(np.sum(bits) % 2)])


def cycle_answer(actions: np.ndarray) -> np.ndarray:
  return np.array([int(np.sum(np.asarray(actions) - 1) % CYCLE_LENGTH)])


def arithmetic_symbols(ids: np.ndarray) -> list:
  return [str(i) if i < MODULUS else (ARITHMETIC_OPS + ('_',))[i - MODULUS] for i in ids]


def arithmetic_answer(ids: np.ndarray) -> np.ndarray:
  return np.array([expressions.evaluate(arithmetic_symbols(ids), MODULUS)])


def _arithmetic_draw(rng, batch_size, length):
  n = length if length % 2 else length - 1
  if n == 0:  # length 1 is odd; only reached for length 0, which Task.sample refuses
    raise ValueError('modular_arithmetic needs length >= 1')
  out = np.empty((batch_size, n), np.int64)
  out[:, ::2] = rng.integers(0, MODULUS, size=(batch_size, n // 2 + 1))
  out[:, 1::2] = MODULUS + rng.integers(0, len(ARITHMETIC_OPS), size=(batch_size, n // 2))
  return out


EVEN_PAIRS = base.Task('even_pairs', 'regular', 2, 2, base.one,
                       _with_answers(_random_ints(2), even_pairs_answer), even_pairs_answer)
MODULAR_ARITHMETIC = base.Task('modular_arithmetic', 'regular', MODULUS + 4, MODULUS, base.one,
                               _with_answers(_arithmetic_draw, arithmetic_answer),
                               arithmetic_answer)
PARITY_CHECK = base.Task('parity_check', 'regular', 2, 2, base.one,
                         _with_answers(_random_ints(2), parity_answer), parity_answer)
CYCLE_NAVIGATION = base.Task('cycle_navigation', 'regular', 3, CYCLE_LENGTH, base.one,
                             _with_answers(_random_ints(3), cycle_answer), cycle_answer)

TASKS = (EVEN_PAIRS, MODULAR_ARITHMETIC, PARITY_CHECK, CYCLE_NAVIGATION)
