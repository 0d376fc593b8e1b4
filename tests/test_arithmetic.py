"""The arithmetic chain-of-thought task: generator, solver, tokenizer, iterator, greedy scoring."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bipe_jax.evaluation import arithmetic_accuracy as acc
from bipe_jax.tasks import arithmetic as A


def _num_ops(expr):
  return sum(expr.count(op) for op in '+-*')


@pytest.mark.parametrize('modulus', [2, 7, 10])
def test_every_step_keeps_python_value_and_reduces_one_operator(modulus):
  rng = np.random.default_rng(modulus)
  for num_ops in range(1, 11):
    for _ in range(30):
      p = A.make_problem(rng, num_ops, modulus)
      expected = eval(p.expression) % modulus  # Python's own evaluation of the expression
      assert _num_ops(p.expression) == num_ops
      assert p.answer == str(expected)
      assert len(p.steps) == num_ops + 1
      for before, after in zip(p.steps, p.steps[1:]):
        assert eval(after) % modulus == expected, (before, after)
        assert _num_ops(after) == _num_ops(before) - 1
        assert re.fullmatch(r'[0-9+\-*()]+', after)
        assert '()' not in after and not re.search(r'\(\d\)', after)  # no '(n)' left over


def test_reduce_once_hand_examples():
  assert A.reduce_once('3*(4+5)-1', 7) == '3*2-1'
  assert A.reduce_once('3*2-1', 7) == '6-1'
  assert A.reduce_once('2-3-1', 7) == '6-1'  # leftmost first, -1 mod 7 = 6
  assert A.reduce_once('2+3*4', 7) == '2+5'  # '*' before '+'
  assert A.reduce_once('(1+2)*(3+4)', 10) == '3*(3+4)'
  assert A.reduce_once('(1+2*3)*4', 10) == '(1+6)*4'
  assert A.solve_steps('(1+2*3)*4', 10) == ['(1+2*3)*4', '(1+6)*4', '7*4', '8']
  with pytest.raises(ValueError, match='nothing to reduce'):
    A.reduce_once('7', 10)


def test_rendering_keeps_needed_parentheses():
  assert A._render(('-', 5, ('-', 3, 1))) == '5-(3-1)'
  assert A._render(('*', ('+', 1, 2), 3)) == '(1+2)*3'
  assert A._render(('+', 1, ('*', 2, 3))) == '1+2*3'
  assert A._render(('-', ('-', 5, 3), 1)) == '5-3-1'


def test_problem_text_and_prompt():
  p = A.Problem('3*(4+5)-1', tuple(A.solve_steps('3*(4+5)-1', 7)), 3)
  assert p.text == '3*(4+5)-1=3*2-1=6-1=5'
  assert p.prompt == '3*(4+5)-1='
  assert p.answer == '5'


def test_tokenizer_round_trip_and_errors():
  tok = A.get_tokenizer(None)
  ids = tok.encode('3*(4+5)=3*2', add_bos=True, add_eos=True)
  assert ids[0] == tok.bos_id == 1 and ids[-1] == tok.eos_id == 2
  assert tok.decode(ids) == '3*(4+5)=3*2'
  assert tok.vocab_size == len(A.VOCAB) == 19
  assert max(ids) < tok.vocab_size
  eq = tok.encode('=')[0]
  assert tok.separator_ids('auto') == (eq,) == tok.separator_ids('official')
  assert tok.separator_ids([3, 4]) == (3, 4)
  with pytest.raises(ValueError, match='not in the vocabulary'):
    tok.encode('3/4')
  with pytest.raises(ValueError, match='outside'):
    tok.separator_ids([99])
  with pytest.raises(ValueError, match='rule'):
    tok.separator_ids('sentences')


def test_splits_are_longer_for_eval_and_deterministic():
  s = A.TaskSettings(modulus=7, train_min_ops=1, train_max_ops=3, eval_max_ops=5, seed=3)
  train = A.problems_by_length(s, 'test', 5)
  ev = A.problems_by_length(s, 'eval', 5)
  assert sorted(train) == [1, 2, 3] and sorted(ev) == [4, 5]
  assert all(p.num_ops == n == _num_ops(p.expression) for n, ps in ev.items() for p in ps)
  again = A.problems_by_length(s, 'eval', 5)
  assert [p.text for p in ev[5]] == [p.text for p in again[5]]
  with pytest.raises(ValueError, match='split'):
    A.problems_by_length(s, 'validation', 5)


def _cfg(**kw):
  c = ml_collections.ConfigDict({'seq_len': 48, 'seed': 0, 'arithmetic_modulus': 7,
                                 'arithmetic_train_min_ops': 1, 'arithmetic_train_max_ops': 4,
                                 'arithmetic_eval_max_ops': 6})
  c.update(kw)
  return c


@pytest.mark.parametrize('field,value,match', [
    ('arithmetic_modulus', 11, 'arithmetic_modulus'),
    ('arithmetic_train_min_ops', 0, 'train_min_ops'),
    ('arithmetic_eval_max_ops', 4, 'eval_max_ops'),
    ('seq_len', 1, 'seq_len'),
])
def test_bad_settings_name_the_field(field, value, match):
  with pytest.raises(ValueError, match=match):
    A.settings_from_config(_cfg(**{field: value}))


def test_train_iterator_rows_are_packed_solved_problems():
  it = A.make_train_iterator(_cfg(), 4, 0, 1)
  batch = next(it)
  tokens = batch['tokens']
  assert tokens.shape == (4, 48) and tokens.dtype == np.int32
  tok = A.ArithmeticTokenizer()
  for row in tokens:
    assert row[0] == tok.bos_id
    # every complete <bos> ... <eos> problem in the row is a correct chain of training length
    for part in np.split(row, np.where(row == tok.bos_id)[0][1:]):
      if part[-1] != tok.eos_id:
        continue  # the cut tail of the row
      steps = tok.decode(part).split('=')
      assert 1 <= _num_ops(steps[0]) <= 4
      assert steps == A.solve_steps(steps[0], 7)


def test_train_iterator_determinism_state_and_sharding():
  first = [next(it)['tokens'] for it in [A.make_train_iterator(_cfg(), 2, 0, 1)] for _ in range(3)]
  it = A.make_train_iterator(_cfg(), 2, 0, 1)
  np.testing.assert_array_equal(next(it)['tokens'], first[0])
  state = it.get_state()
  expected = [next(it)['tokens'] for _ in range(2)]
  it2 = A.make_train_iterator(_cfg(), 2, 0, 1)
  it2.set_state(state)
  for e in expected:
    np.testing.assert_array_equal(next(it2)['tokens'], e)
  other_seed = next(A.make_train_iterator(_cfg(seed=1), 2, 0, 1))['tokens']
  assert not np.array_equal(other_seed, first[0])
  # two processes with 1 row each partition the single-process stream of 2 rows per batch
  p0 = next(A.make_train_iterator(_cfg(), 1, 0, 2))['tokens']
  p1 = next(A.make_train_iterator(_cfg(), 1, 1, 2))['tokens']
  np.testing.assert_array_equal(np.concatenate([p0, p1]), first[0])


def _oracle_apply(params, buf):
  """A stand-in model: params = (table [N, L] of sequences, m); each input row is matched to
  the table row with the same first m tokens (its prompt), whose next tokens it predicts."""
  table, m = params
  same = jnp.all(buf[:, None, :m] == table[None, :, :m], axis=-1)  # [B, N]
  rows = table[jnp.argmax(same, axis=1)]
  return 10.0 * jax_one_hot(jnp.roll(rows, -1, axis=1), len(A.VOCAB))


def jax_one_hot(x, n):
  return (x[..., None] == jnp.arange(n)).astype(jnp.float32)


@pytest.mark.parametrize('corrupt', [False, 'answer', 'step'])
def test_greedy_accuracy_with_an_oracle_model(corrupt):
  s = A.TaskSettings(train_max_ops=2, eval_max_ops=4)
  problems = A.problems_by_length(s, 'eval', 6, num_ops=[3])
  tok = A.ArithmeticTokenizer()
  seqs = [tok.encode(p.text, add_bos=True, add_eos=True) for p in problems[3]]
  max_len = max(map(len, seqs)) + 8
  table = np.zeros((6, max_len), np.int32)
  for i, s_ in enumerate(seqs):
    table[i, :len(s_)] = s_
    if corrupt == 'answer' and i % 2:  # a wrong final answer on odd rows
      table[i, len(s_) - 2] = tok.encode(str((int(problems[3][i].answer) + 1) % 7))[0]
    if corrupt == 'step' and i % 2:  # a wrong first solution step, right final answer
      at = len(problems[3][i].prompt) + 1
      table[i, at] = tok.encode('9')[0]
  m = min(len(p.prompt) for p in problems[3]) + 1
  assert len({p.prompt[:m - 1] for p in problems[3]}) == 6  # the oracle can tell them apart
  oracle = jax.tree_util.Partial(_oracle_apply, (jnp.asarray(table), m))
  res, = acc.accuracy_by_length(lambda params, buf: oracle(buf), None, problems,
                                batch_size=4, max_len=max_len)
  assert res.count == 6 and res.num_ops == 3
  assert res.accuracy == (0.5 if corrupt == 'answer' else 1.0)
  assert res.chain_accuracy == (1.0 if not corrupt else 0.5)
  md = acc.format_accuracy_table({'oracle': [res]}, train_max_ops=2)
  assert f'{res.accuracy:.3f}' in md


def test_greedy_generate_stops_at_eos_and_at_max_len():
  # successor model: next token = current token + 1 (so from 5 it writes 6, 7, ...)
  def succ(params, buf):
    del params
    return jax_one_hot((buf + 1) % 12, 12)

  out = acc.greedy_generate(succ, None, [[0], [5, 6]], max_len=6, eos_id=3, batch_size=4)
  assert out[0] == [1, 2, 3]  # stopped at eos=3 (included)
  assert out[1] == [7, 8, 9, 10]  # ran to max_len
  with pytest.raises(ValueError, match='max_len'):
    acc.greedy_generate(succ, None, [[0] * 6], max_len=6, eos_id=3)
