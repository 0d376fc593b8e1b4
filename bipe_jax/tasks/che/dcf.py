"""Deterministic context-free tasks: stack manipulation, reverse string, modular arithmetic with
brackets, solve equation.

  stack_manipulation  a stack bottom-to-top (bits 0 1, at least one) then actions POP = 2,
                      PUSH 0 = 3, PUSH 1 = 4 (POP on an empty stack does nothing) -> the final
                      stack top-to-bottom, then the terminator 2, zero-padded to length + 1.
  reverse_string      bits -> the bits reversed.
  modular_arithmetic_brackets  a random bracketed expression of exactly `length` symbols over
                      digits 0..4 (ids 0..4), + - * ( ) (ids 5..9; id 10 is the benchmark's
                      unused 'x') -> its value mod 5. Lengths 1..4 are d, -d, (d), (-d); longer
                      ones (left op right) with a random split, as the benchmark's generator.
  solve_equation      such an expression (+ and - only) of length - 2 symbols with one digit
                      replaced by x, then '=' and its value (ids: digits 0..4, + 5, - 6, ( 7,
                      ) 8, x 9, = 10) -> the replaced digit. Lengths < 3: all-zero input,
                      answer 0 (the benchmark's placeholder batch).
"""

import numpy as np

from bipe_jax.tasks.che import base
from bipe_jax.tasks.che import expressions
from bipe_jax.tasks.che import regular

MODULUS = regular.MODULUS
POP, PUSH0, PUSH1, STACK_END = 2, 3, 4, 2
BRACKET_IDS = {'+': MODULUS, '-': MODULUS + 1, '*': MODULUS + 2, '(': MODULUS + 3,
               ')': MODULUS + 4, 'x': MODULUS + 5}
EQUATION_IDS = {'+': MODULUS, '-': MODULUS + 1, '(': MODULUS + 2, ')': MODULUS + 3,
                'x': MODULUS + 4, '=': MODULUS + 5}


def _to_ids(symbols, table) -> list:
  return [int(s) if s.isdigit() else table[s] for s in symbols]


def _to_symbols(ids, table) -> list:
  inverse = {v: k for k, v in table.items()}
  return [str(i) if i < MODULUS else inverse[int(i)] for i in ids]


# --- stack manipulation -------------------------------------------------------------------------

def stack_answer(ids: np.ndarray) -> np.ndarray:
  ids = [int(i) for i in ids]
  n_stack = next((i for i, s in enumerate(ids) if s >= POP), len(ids))
  stack = ids[:n_stack]
  for action in ids[n_stack:]:
    if action == POP:
      if stack:
        stack.pop()
    else:
      stack.append(action - PUSH0)
  out = stack[::-1] + [STACK_END]
  return np.array(out + [0] * (len(ids) + 1 - len(out)))


def _stack_draw(rng, batch_size, length):
  rows = []
  for _ in range(batch_size):
    n_stack = 1 if length == 1 else int(rng.integers(1, length))
    stack = rng.integers(0, 2, size=n_stack)
    actions = rng.integers(POP, PUSH1 + 1, size=length - n_stack)
    rows.append(np.concatenate([stack, actions]))
  inputs = base.batch_of(rows)
  return inputs, base.batch_of([stack_answer(r) for r in inputs])


# --- bracketed expressions ----------------------------------------------------------------------

def random_expression(rng: np.random.Generator, length: int, mult: bool) -> tuple:
  """(symbols, value mod 5) of a random bracketed expression of exactly `length` symbols."""
  if length < 1:
    raise ValueError(f'an expression needs length >= 1, got {length}.')
  if length <= 4:
    d = int(rng.integers(0, MODULUS))
    value = -d % MODULUS if length in (2, 4) else d
    return {1: [str(d)], 2: ['-', str(d)], 3: ['(', str(d), ')'],
            4: ['(', '-', str(d), ')']}[length], value
  left_length = int(rng.integers(1, length - 3))
  left, a = random_expression(rng, left_length, mult)
  right, b = random_expression(rng, length - 3 - left_length, mult)
  op = ('+', '-', '*')[int(rng.integers(0, 3 if mult else 2))]
  value = {'+': a + b, '-': a - b, '*': a * b}[op] % MODULUS
  return ['('] + left + [op] + right + [')'], value


def brackets_answer(ids: np.ndarray) -> np.ndarray:
  return np.array([expressions.evaluate(_to_symbols(ids, BRACKET_IDS), MODULUS)])


def _brackets_draw(rng, batch_size, length):
  rows, values = [], []
  for _ in range(batch_size):
    symbols, value = random_expression(rng, length, mult=True)
    rows.append(_to_ids(symbols, BRACKET_IDS))
    values.append([value])
  return base.batch_of(rows), base.batch_of(values)


# --- solve equation -----------------------------------------------------------------------------

def equation_answer(ids: np.ndarray) -> np.ndarray:
  """The x of `lhs(x) = v` (lhs has + and - only, so it is v0 + c x with c = +-1)."""
  symbols = _to_symbols(ids, EQUATION_IDS)
  if 'x' not in symbols:  # the all-zero placeholder of lengths < 3
    return np.array([0])
  eq = symbols.index('=')
  value = int(''.join(symbols[eq + 1:]))
  at = lambda x: expressions.evaluate([str(x) if s == 'x' else s for s in symbols[:eq]],
                                      MODULUS)
  v0, slope = at(0), (at(1) - at(0)) % MODULUS
  return np.array([(value - v0) * pow(slope, -1, MODULUS) % MODULUS])


def _equation_draw(rng, batch_size, length):
  if length < 3:
    return np.zeros((batch_size, length), np.int64), np.zeros((batch_size, 1), np.int64)
  rows, solutions = [], []
  for _ in range(batch_size):
    symbols, value = random_expression(rng, length - 2, mult=False)
    i = int(rng.integers(0, len(symbols)))
    while not symbols[i].isdigit():
      i = (i + 1) % len(symbols)
    solutions.append([int(symbols[i])])
    symbols = symbols[:i] + ['x'] + symbols[i + 1:] + ['=', str(value)]
    rows.append(_to_ids(symbols, EQUATION_IDS))
  return base.batch_of(rows), base.batch_of(solutions)


def _reverse_draw(rng, batch_size, length):
  inputs = rng.integers(0, 2, size=(batch_size, length))
  return inputs, inputs[:, ::-1]


STACK_MANIPULATION = base.Task('stack_manipulation', 'dcf', 5, 3, lambda n: n + 1, _stack_draw,
                               stack_answer, terminator=STACK_END)
REVERSE_STRING = base.Task('reverse_string', 'dcf', 2, 2, lambda n: n, _reverse_draw,
                           lambda ids: np.asarray(ids)[::-1])
MODULAR_ARITHMETIC_BRACKETS = base.Task('modular_arithmetic_brackets', 'dcf', MODULUS + 6,
                                        MODULUS, base.one, _brackets_draw, brackets_answer)
SOLVE_EQUATION = base.Task('solve_equation', 'dcf', MODULUS + 6, MODULUS, base.one,
                           _equation_draw, equation_answer,
                           separator_ids=(EQUATION_IDS['='],))

TASKS = (STACK_MANIPULATION, REVERSE_STRING, MODULAR_ARITHMETIC_BRACKETS, SOLVE_EQUATION)
