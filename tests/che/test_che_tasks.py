"""The Chomsky-hierarchy tasks: hand-computed examples (the benchmark's own docstring examples,
in our ids) and brute-force checkers that compute every answer a second, independent way on
random samples of every task at many lengths."""

import math

import numpy as np
import pytest

from bipe_jax.tasks import che

LENGTHS = (1, 2, 3, 4, 5, 6, 7, 12, 13, 40, 41, 97)
ARITH = {5: '+', 6: '-', 7: '*'}
BRACKETS = {5: '+', 6: '-', 7: '*', 8: '(', 9: ')'}
EQUATION = {5: '+', 6: '-', 7: '(', 8: ')', 9: 'x', 10: '='}


def _ids(text: str, table: dict) -> list:
  inverse = {v: k for k, v in table.items()}
  return [int(c) if c.isdigit() else inverse[c] for c in text.replace(' ', '')]


def _bits(text: str) -> list:
  return [int(c) for c in text.replace(' ', '')]


def _text(ids, table) -> str:
  return ''.join(str(i) if i < 5 else table[int(i)] for i in ids)


# (task, input ids, expected output ids), computed by hand.
HAND_EXAMPLES = [
    ('even_pairs', _bits('001110'), [0]),
    ('even_pairs', _bits('0101001'), [1]),  # 01 x3, 10 x2
    ('modular_arithmetic', _ids('1+2*3', ARITH), [2]),  # 7 mod 5
    ('modular_arithmetic', _ids('1-1-1', ARITH), [4]),  # -1 mod 5
    ('modular_arithmetic', _ids('0*1+4*3-2', ARITH), [0]),  # 10 mod 5
    ('parity_check', _bits('1010100'), [1]),
    ('parity_check', _bits('01111'), [0]),
    ('cycle_navigation', [2, 0, 1, 0, 0], [3]),  # +1 -1 0 -1 -1 = -2
    ('cycle_navigation', [2, 2, 2, 0], [2]),
    ('stack_manipulation', [0, 1, 1, 0, 4, 2, 2], [1, 1, 0, 2, 0, 0, 0, 0]),
    ('stack_manipulation', [1, 1, 0, 2, 2, 2], [2, 0, 0, 0, 0, 0, 0]),
    ('stack_manipulation', [1, 2, 2, 3], [0, 2, 0, 0, 0]),  # POP on an empty stack: no-op
    ('reverse_string', _bits('011010'), _bits('010110')),
    ('modular_arithmetic_brackets', _ids('((3*4)-(-2))', BRACKETS), [4]),  # 14 mod 5
    ('modular_arithmetic_brackets', _ids('(-3)', BRACKETS), [2]),
    ('solve_equation', _ids('(x+3)=1', EQUATION), [3]),  # x = 1 - 3 mod 5
    ('solve_equation', _ids('((1-x)+2)=0', EQUATION), [3]),
    ('solve_equation', [0, 0], [0]),  # the placeholder of lengths < 3
    ('duplicate_string', _bits('101'), _bits('101101')),
    ('missing_duplicate_string', [0, 1, 1, 0, 0, 2, 1, 0], [1]),
    ('missing_duplicate_string', [1, 0, 1, 1, 2, 1, 3], [0]),
    ('odds_first', _bits('00110101'), _bits('0111 0100')),  # the benchmark's code: 1::2 first
    ('odds_first', _bits('110'), _bits('1 10')),
    # 4 + 22 = 26 = 11010b, little-endian 01011, terminator 2, padded to 10
    ('binary_addition', _bits('001 2 01101'), [0, 1, 0, 1, 1, 2, 0, 0, 0, 0]),
    ('binary_addition', _bits('01'), [0, 1, 2]),  # length 2: the number 2, no '+'
    # 4 * 22 = 88 = 1011000b, little-endian 0001101, terminator, padded to 9
    ('binary_multiplication', _bits('001 2 01101'), [0, 0, 0, 1, 1, 0, 1, 2, 0]),
    ('binary_multiplication', _bits('1'), [2]),  # length 1: the placeholder answer
    ('compute_sqrt', _bits('100101'), _bits('110')),  # isqrt(37) = 6 = 110b
    ('compute_sqrt', _bits('111'), _bits('10')),  # isqrt(7) = 2
    ('bucket_sort', [1, 0, 2, 0, 4, 1, 1, 2], [0, 0, 1, 1, 1, 2, 2, 4]),
]


@pytest.mark.parametrize('name,inputs,expected', HAND_EXAMPLES)
def test_hand_computed_examples(name, inputs, expected):
  task = che.get_task(name)
  np.testing.assert_array_equal(task.answer(np.asarray(inputs)), expected)
  assert len(expected) == task.output_length(len(inputs))


def test_hand_computed_accuracy_masks():
  task = che.get_task('binary_addition')
  mask = task.accuracy_mask(np.array([[0, 1, 0, 1, 1, 2, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0, 0, 0, 0, 0]]))
  np.testing.assert_array_equal(mask.sum(axis=1), [6, 1])
  assert che.get_task('reverse_string').accuracy_mask(np.zeros((2, 5), int)).all()


def test_every_level_has_its_tasks():
  levels = {}
  for task in che.TASKS.values():
    levels.setdefault(task.level, []).append(task.name)
  assert {k: len(v) for k, v in levels.items()} == {'regular': 4, 'dcf': 4, 'cs': 7}
  with pytest.raises(ValueError, match='unknown CHE task'):
    che.get_task('parity')


# --- brute-force checkers: each recomputes the answer without the task's own code ----------------

def _little_endian(bits) -> int:
  return int(''.join(str(int(b)) for b in reversed(list(bits))) or '0', 2)


def _decoded_terminated(target) -> list:
  target = [int(t) for t in target]
  end = target.index(2)
  assert all(t == 0 for t in target[end + 1:])  # zero padding after the terminator
  return target[:end]


def _check_binary(op, inputs, target):
  inputs = [int(i) for i in inputs]
  digits = _decoded_terminated(target)
  if 2 not in inputs:  # lengths <= 2
    if op == 'add':
      assert _little_endian(digits) == _little_endian(inputs)
      assert digits == [0] or digits[-1] == 1
    else:
      assert digits == [0] * (len(inputs) - 1)
    return
  at = inputs.index(2)
  n, m = _little_endian(inputs[:at]), _little_endian(inputs[at + 1:])
  assert n >= 1 and m >= 1
  assert _little_endian(digits) == (n + m if op == 'add' else n * m)
  assert digits[-1] == 1  # no leading zeros


def _check_stack(inputs, target):
  stack = ''
  for s in inputs:  # the stack as a string, top at the right
    if s in (0, 1):
      stack += str(s)
    elif s == 2:
      stack = stack[:-1]
    else:
      stack += str(s - 3)
  assert ''.join(map(str, _decoded_terminated(target))) == stack[::-1]
  assert inputs[0] in (0, 1)  # the initial stack is never empty


def _check_equation(inputs, target):
  text = _text(inputs, EQUATION)
  if 'x' not in text:
    assert set(inputs) == {0} and target[0] == 0 and len(inputs) < 3
    return
  lhs, rhs = text.split('=')
  solutions = [x for x in range(5) if eval(lhs.replace('x', str(x))) % 5 == int(rhs)]
  assert solutions == [target[0]]
  assert text.count('x') == 1 and '*' not in text


def _check_missing(inputs, target):
  if len(inputs) == 1:
    assert inputs[0] == 1 and target[0] == 1
    return
  body = list(inputs[:len(inputs) - len(inputs) % 2])
  assert list(inputs[len(body):]) == [3] * (len(inputs) % 2)
  half = len(body) // 2
  first, second = body[:half], body[half:]
  assert sum(s == 2 for s in body) == 1
  merged = [b if a == 2 else a for a, b in zip(first, second)]
  assert all(a == b for a, b in zip(first, second) if 2 not in (a, b))
  assert target[0] == merged[(first + second).index(2) % half]


CHECKERS = {
    'even_pairs': lambda x, y: y[0] == sum(
        (a, b) in ((0, 1), (1, 0)) for a, b in zip(x, x[1:])) % 2,
    'parity_check': lambda x, y: y[0] == ''.join(map(str, x)).count('1') % 2,
    'cycle_navigation': lambda x, y: y[0] == _walk(x),
    'modular_arithmetic': lambda x, y: (len(x) % 2 == 1 and
                                        y[0] == eval(_text(x, ARITH)) % 5),
    'stack_manipulation': _check_stack,
    'reverse_string': lambda x, y: list(y) == list(reversed(list(x))),
    'modular_arithmetic_brackets': lambda x, y: y[0] == eval(_text(x, BRACKETS)) % 5,
    'solve_equation': _check_equation,
    'duplicate_string': lambda x, y: list(y) == list(x) * 2,
    'missing_duplicate_string': _check_missing,
    'odds_first': lambda x, y: list(y) == ([s for i, s in enumerate(x) if i % 2] +
                                           [s for i, s in enumerate(x) if not i % 2]),
    'binary_addition': lambda x, y: _check_binary('add', x, y),
    'binary_multiplication': lambda x, y: _check_binary('mul', x, y),
    'compute_sqrt': lambda x, y: _check_sqrt(x, y),
    'bucket_sort': lambda x, y: list(y) == [s for s in range(5) for _ in range(list(x).count(s))],
}


def _walk(actions) -> int:
  state = 0
  for a in actions:
    state = {0: (state - 1) % 5, 1: state, 2: (state + 1) % 5}[int(a)]
  return state


def _check_sqrt(inputs, target):
  n = int(''.join(map(str, inputs)), 2)
  r = int(''.join(map(str, target)), 2)
  assert n >= 1 and r * r <= n < (r + 1) ** 2


@pytest.mark.parametrize('name', che.TASK_NAMES)
def test_random_samples_against_brute_force(name):
  task = che.get_task(name)
  for length in LENGTHS:
    batch = task.sample(np.random.default_rng(length), 16, length)
    expected_in = length - 1 if name == 'modular_arithmetic' and length % 2 == 0 else length
    assert batch.inputs.shape == (16, expected_in), (name, length)
    assert batch.targets.shape == (16, task.output_length(length))
    assert batch.inputs.min() >= 0 and batch.inputs.max() < task.input_size
    assert batch.targets.min() >= 0 and batch.targets.max() < task.output_size
    for x, y, m in zip(batch.inputs, batch.targets, batch.mask):
      x, y = [int(v) for v in x], [int(v) for v in y]
      ok = CHECKERS[name](x, y)
      assert ok is None or ok, (name, length, x, y)
      np.testing.assert_array_equal(task.answer(np.asarray(x)), y)  # generation == answer
      if task.terminator is not None:
        assert m.sum() == y.index(task.terminator) + 1
      else:
        assert m.all()


@pytest.mark.parametrize('name', che.TASK_NAMES)
def test_seeded_and_long(name):
  task = che.get_task(name)
  a = task.sample(np.random.default_rng(7), 4, 500)
  b = task.sample(np.random.default_rng(7), 4, 500)
  np.testing.assert_array_equal(a.inputs, b.inputs)
  np.testing.assert_array_equal(a.targets, b.targets)
  c = task.sample(np.random.default_rng(8), 4, 500)
  assert not np.array_equal(a.inputs, c.inputs)
  assert a.targets.shape[1] == task.output_length(500)


def test_length_zero_is_refused():
  with pytest.raises(ValueError, match='length must be >= 1'):
    che.get_task('parity_check').sample(np.random.default_rng(0), 1, 0)
