"""Arithmetic expressions over the integers mod a prime p, generated as Feng et al. (2023) do.

An expression is a list of tokens (str): numbers '0'..str(p-1) (one token each, so '10' is one
token when p = 11), the operators + - * / and parentheses. Division is in the field:
a / b = a * b^(p-2) mod p, b != 0.

Generation (`solution_chain`) follows Feng et al.'s arithmetic data (docs/arithmetic_task.md):
start from a random number (the answer); `num_ops` times, replace a uniformly chosen number x
by a random pair `a op b` whose value is x, in parentheses only where the neighbouring
operators need them (`needs_parentheses`). The chain-of-thought solution is that history read
backwards: the full expression, then one step per operator, each step evaluating exactly one
pair of numbers (the one expanded last), down to the answer. Which pair a step evaluates is
therefore random (any pair of two numbers may come first); every step keeps the value.

`evaluate` reads an expression with the usual precedence (* / before + -, left to right);
`is_one_reduction` is how a generated chain is checked (a step may reduce any pair).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

OPERATORS = ('+', '-', '*', '/')
PARENTHESES = ('(', ')')
MAX_MODULUS = 11  # numbers are single tokens '0'..'10'
PRIMES = (2, 3, 5, 7, 11)


def check_modulus(p: int, field: str = 'modulus') -> int:
  """p as int when it is a prime <= MAX_MODULUS (division needs a field); else ValueError."""
  if int(p) not in PRIMES:
    raise ValueError(f'{field}={p}: allowed {PRIMES} (a prime, so that division is defined, '
                     f'and at most {MAX_MODULUS}: numbers are single tokens)')
  return int(p)


def apply_operator(a: int, op: str, b: int, p: int) -> int:
  """a op b mod p; '/' multiplies by the inverse of b (ValueError when b = 0 mod p)."""
  if op == '+':
    return (a + b) % p
  if op == '-':
    return (a - b) % p
  if op == '*':
    return (a * b) % p
  if op == '/':
    if b % p == 0:
      raise ValueError(f'division by zero mod {p}')
    return (a * pow(b, p - 2, p)) % p
  raise ValueError(f'unknown operator {op!r}')


def random_pair(rng: np.random.Generator, x: int, p: int) -> tuple[int, str, int]:
  """(a, op, b) with a op b = x mod p: a and op uniform, b solved for; the draws Feng et al.
  discard (a = 0 with '*' and x != 0; a = 0 or x = 0 with '/', unless both are 0, then b is a
  random nonzero number) are drawn again."""
  while True:
    a = int(rng.integers(p))
    op = OPERATORS[int(rng.integers(len(OPERATORS)))]
    if op == '+':
      return a, op, (x - a) % p
    if op == '-':
      return a, op, (a - x) % p
    if op == '*':
      if a == 0:
        if x != 0:
          continue
        return a, op, int(rng.integers(p))
      return a, op, (x * pow(a, p - 2, p)) % p
    if a == 0 and x == 0:
      return a, op, int(rng.integers(1, p))
    if a == 0 or x == 0:
      continue
    return a, op, (a * pow(x, p - 2, p)) % p


def needs_parentheses(tokens: Sequence[str], index: int, op: str) -> bool:
  """Whether `a op b` replacing the number tokens[index] needs parentheses (Feng et al.'s
  rule): always after '/', for + - after '*' or before '*' '/', and for + - after '-'."""
  before = tokens[index - 1] if index > 0 else None
  after = tokens[index + 1] if index + 1 < len(tokens) else None
  if before == '/':
    return True
  if before == '*' or after in ('*', '/'):
    return op in ('+', '-')
  if before == '-':
    return op in ('+', '-')
  return False


def solution_chain(rng: np.random.Generator, num_ops: int, p: int) -> list[list[str]]:
  """[expression, step 1, ..., answer] as token lists: `num_ops` + 1 entries, each with one
  operator fewer than the one before, all of the same value mod p."""
  tokens = [str(int(rng.integers(p)))]
  history = [tokens]
  for _ in range(num_ops):
    numbers = [i for i, t in enumerate(tokens) if t.isdigit()]
    i = numbers[int(rng.integers(len(numbers)))]
    a, op, b = random_pair(rng, int(tokens[i]), p)
    pair = [str(a), op, str(b)]
    if needs_parentheses(tokens, i, op):
      pair = ['('] + pair + [')']
    tokens = tokens[:i] + pair + tokens[i + 1:]
    history.append(tokens)
  return history[::-1]


def count_operators(tokens: Sequence[str]) -> int:
  return sum(t in OPERATORS for t in tokens)


def max_chain_tokens(num_ops: int) -> int:
  """Most tokens a chain of `num_ops` operators can have, separators included (no bos/eos):
  an expression of k operators has at most 4k + 1 tokens (each expansion adds <= 4)."""
  return sum(4 * k + 1 for k in range(num_ops + 1)) + num_ops


def evaluate(tokens: Sequence[str], p: int) -> int:
  """The value mod p of a token list read with the usual precedence; ValueError when it is
  not a well-formed expression (or divides by zero)."""
  pos = 0

  def peek():
    return tokens[pos] if pos < len(tokens) else None

  def factor():
    nonlocal pos
    t = peek()
    if t == '(':
      pos += 1
      value = expression()
      if peek() != ')':
        raise ValueError(f'missing ")" in {"".join(tokens)!r}')
      pos += 1
      return value
    if t is not None and t.isdigit() and int(t) < p:
      pos += 1
      return int(t)
    raise ValueError(f'expected a number or "(" at token {pos} of {"".join(tokens)!r}')

  def chain(operand, ops):
    nonlocal pos
    value = operand()
    while peek() in ops:
      op = peek()
      pos += 1
      value = apply_operator(value, op, operand(), p)
    return value

  def expression():
    return chain(lambda: chain(factor, ('*', '/')), ('+', '-'))

  value = expression()
  if pos != len(tokens):
    raise ValueError(f'unexpected token {tokens[pos]!r} at {pos} of {"".join(tokens)!r}')
  return value


def is_one_reduction(before: Sequence[str], after: Sequence[str], p: int) -> bool:
  """Whether `after` is a valid next step of `before`: a well-formed expression with exactly
  one operator fewer and the same value mod p."""
  try:
    return (count_operators(after) == count_operators(before) - 1
            and evaluate(after, p) == evaluate(before, p))
  except ValueError:
    return False
