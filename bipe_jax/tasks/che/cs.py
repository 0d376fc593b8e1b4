"""Context-sensitive tasks: duplicate string, missing duplicate, odds first, binary addition,
binary multiplication, compute sqrt, bucket sort.

  duplicate_string          bits s -> s s (2 * length outputs).
  missing_duplicate_string  s s over bits (|s| = length // 2) with one symbol replaced by 2,
                            then a 3 when the length is odd -> the replaced bit. Length 1: the
                            input [1], answer 1 (the benchmark's placeholder).
  odds_first                s_1 s_2 ... s_n -> s_2 s_4 ... s_1 s_3 ... (the symbols at odd
                            0-based indices first; length outputs). This is the benchmark's
                            code (`[:, 1::2]` then `[:, ::2]`); its docstring example says the
                            opposite order.
  binary_addition           n + m: little-endian bits of n, 2, bits of m (n, m >= 1, a random
                            split of length - 1 digits) -> n + m little-endian without trailing
                            zeros, the terminator 2, zero-padded to length + 1. Lengths <= 2: one
                            number n in [0, 2^length - 2] as `length` bits, no '+', answer n.
  binary_multiplication     the same with n * m, padded to `length` outputs. Lengths <= 2: the
                            benchmark's placeholder answer (length - 1 zeros, terminator).
  compute_sqrt              big-endian bits of n in [1, 2^length - 1] -> floor(sqrt(n)) as
                            ceil(length / 2) big-endian bits.
  bucket_sort               symbols 0..4 -> sorted (length outputs).
"""

import math

import numpy as np

from bipe_jax.tasks.che import base

PLUS = TIMES = END = 2
MISSING, FILLER = 2, 3


def _little_endian_int(bits) -> int:
  return sum(int(b) << i for i, b in enumerate(bits))


def _little_endian_bits(n: int) -> list:
  """Bits of n >= 0, least significant first, without trailing zeros ([0] for 0)."""
  return [int(c) for c in f'{n:b}'[::-1]]


def _operands(ids) -> tuple:
  ids = [int(i) for i in ids]
  if PLUS not in ids:
    return None
  at = ids.index(PLUS)
  return _little_endian_int(ids[:at]), _little_endian_int(ids[at + 1:])


def addition_answer(ids: np.ndarray) -> np.ndarray:
  pair = _operands(ids)
  total = _little_endian_int(ids) if pair is None else pair[0] + pair[1]
  out = _little_endian_bits(total) + [END]
  return np.array(out + [0] * (len(ids) + 1 - len(out)))


def multiplication_answer(ids: np.ndarray) -> np.ndarray:
  pair = _operands(ids)
  out = ([0] * (len(ids) - 1) if pair is None else _little_endian_bits(pair[0] * pair[1])) + [END]
  return np.array(out + [0] * (len(ids) - len(out)))


def _binary_operation_draw(answer):
  def sample(rng, batch_size, length):
    rows = []
    for _ in range(batch_size):
      if length <= 2:
        n = int(rng.integers(0, 2 ** length - 1))
        rows.append([(n >> i) & 1 for i in range(length)])
        continue
      len_n = int(rng.integers(1, length - 1))
      rows.append(list(base.random_bits(rng, len_n)) + [PLUS] +
                  list(base.random_bits(rng, length - 1 - len_n)))
    inputs = base.batch_of(rows)
    return inputs, base.batch_of([answer(r) for r in inputs])
  return sample


def sqrt_answer(ids: np.ndarray) -> np.ndarray:
  n = int(''.join(str(int(b)) for b in ids), 2)
  width = math.ceil(len(ids) / 2)
  return np.array([int(c) for c in f'{math.isqrt(n):b}'.zfill(width)])


def _sqrt_draw(rng, batch_size, length):
  inputs = base.batch_of([base.random_bits(rng, length) for _ in range(batch_size)])
  return inputs, base.batch_of([sqrt_answer(r) for r in inputs])


def missing_answer(ids: np.ndarray) -> np.ndarray:
  ids = [int(i) for i in ids]
  if MISSING not in ids:  # length 1: the placeholder input [1]
    return np.array([1])
  body = [i for i in ids if i != FILLER]
  at, half = body.index(MISSING), len(body) // 2
  return np.array([body[at - half] if at >= half else body[at + half]])


def _missing_draw(rng, batch_size, length):
  if length == 1:
    return np.ones((batch_size, 1), np.int64), np.ones((batch_size, 1), np.int64)
  strings = rng.integers(0, 2, size=(batch_size, length // 2))
  doubled = np.concatenate([strings, strings], axis=1)
  at = rng.integers(0, doubled.shape[1], size=batch_size)
  answers = doubled[np.arange(batch_size), at]
  doubled[np.arange(batch_size), at] = MISSING
  filler = np.full((batch_size, length % 2), FILLER)
  return np.concatenate([doubled, filler], axis=1), answers[:, None]


def _strings(vocab: int, transform):
  def sample(rng, batch_size, length):
    inputs = rng.integers(0, vocab, size=(batch_size, length))
    return inputs, base.batch_of([transform(r) for r in inputs])
  return sample


def duplicate(ids):
  return np.concatenate([ids, ids])


def odds_first(ids):
  return np.concatenate([ids[1::2], ids[::2]])


DUPLICATE_STRING = base.Task('duplicate_string', 'cs', 2, 2, lambda n: 2 * n,
                             _strings(2, duplicate), duplicate)
MISSING_DUPLICATE_STRING = base.Task('missing_duplicate_string', 'cs', 4, 2, base.one,
                                     _missing_draw, missing_answer)
ODDS_FIRST = base.Task('odds_first', 'cs', 2, 2, lambda n: n, _strings(2, odds_first), odds_first)
BINARY_ADDITION = base.Task('binary_addition', 'cs', 3, 3, lambda n: n + 1,
                            _binary_operation_draw(addition_answer), addition_answer,
                            terminator=END, separator_ids=(PLUS,))
BINARY_MULTIPLICATION = base.Task('binary_multiplication', 'cs', 3, 3, lambda n: n,
                                  _binary_operation_draw(multiplication_answer),
                                  multiplication_answer, terminator=END,
                                  separator_ids=(TIMES,))
COMPUTE_SQRT = base.Task('compute_sqrt', 'cs', 2, 2, lambda n: math.ceil(n / 2), _sqrt_draw,
                         sqrt_answer)
BUCKET_SORT = base.Task('bucket_sort', 'cs', 5, 5, lambda n: n, _strings(5, np.sort), np.sort)

TASKS = (DUPLICATE_STRING, MISSING_DUPLICATE_STRING, ODDS_FIRST, BINARY_ADDITION,
         BINARY_MULTIPLICATION, COMPUTE_SQRT, BUCKET_SORT)
