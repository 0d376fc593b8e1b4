"""Evaluation of the arithmetic strings of the modular-arithmetic tasks: digits 0..m-1, binary
+ - *, unary minus, parentheses, with the usual precedence (unary minus, then *, then + and -,
left to right), every value reduced mod m. Iterative (shunting-yard): nesting depth is not
limited by Python's recursion."""

from typing import Sequence

_PRECEDENCE = {'neg': 3, '*': 2, '+': 1, '-': 1}


def _apply(op: str, values: list, modulus: int) -> None:
  if op == 'neg':
    values.append(-values.pop() % modulus)
    return
  b, a = values.pop(), values.pop()
  values.append({'+': a + b, '-': a - b, '*': a * b}[op] % modulus)


def evaluate(symbols: Sequence[str], modulus: int) -> int:
  """The value mod `modulus` of an expression given as symbols ('3', '+', '(', ...)."""
  values, ops = [], []
  expect_operand = True
  for s in symbols:
    if s.isdigit():
      values.append(int(s) % modulus)
      expect_operand = False
    elif s == '(':
      ops.append('(')
      expect_operand = True
    elif s == ')':
      while ops[-1] != '(':
        _apply(ops.pop(), values, modulus)
      ops.pop()
      expect_operand = False
    elif s == '-' and expect_operand:
      ops.append('neg')  # right-associative, binds tightest: nothing to pop
    elif s in ('+', '-', '*'):
      while ops and ops[-1] != '(' and _PRECEDENCE[ops[-1]] >= _PRECEDENCE[s]:
        _apply(ops.pop(), values, modulus)
      ops.append(s)
      expect_operand = True
    else:
      raise ValueError(f'unknown symbol {s!r} in expression {"".join(symbols)!r}')
  while ops:
    _apply(ops.pop(), values, modulus)
  if len(values) != 1:
    raise ValueError(f'malformed expression {"".join(symbols)!r}')
  return values[0]
