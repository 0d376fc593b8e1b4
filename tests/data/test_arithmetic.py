"""The arithmetic chain-of-thought task: expressions mod p, problems, tokenizer, iterator,
bilevel positions of a problem, greedy scoring."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bipe_jax import data
from bipe_jax import model as model_lib
from bipe_jax.evaluation import arithmetic_accuracy as acc
from bipe_jax.tasks import arithmetic as A
from bipe_jax.tasks import modular_expressions as E
from bipe_jax.training import resolve as resolve_lib
from configs import arithmetic_tiny

# A hand-checked problem mod 11: 10-4 = 6, 6/2 = 3 (2*3 = 6), 3*3 = 9.
EXAMPLE = ('3*(10-4)/2', '3*6/2', '3*3', '9')


class ModP:
  """An independent evaluator: Python's own parser and precedence over numbers mod p."""

  def __init__(self, v, p):
    self.v, self.p = v % p, p

  def _o(self, other, f):
    return ModP(f(self.v, other.v), self.p)

  def __add__(self, o):
    return self._o(o, lambda a, b: a + b)

  def __sub__(self, o):
    return self._o(o, lambda a, b: a - b)

  def __mul__(self, o):
    return self._o(o, lambda a, b: a * b)

  def __truediv__(self, o):
    assert o.v != 0, 'division by zero'
    return self._o(o, lambda a, b: a * pow(b, self.p - 2, self.p))


def python_value(text, p):
  return eval(re.sub(r'\d+', lambda m: f'ModP({m.group()}, {p})', text)).v  # pylint: disable=eval-used


def _pieces(text):
  return A.split_pieces(text)


# ------------------------------------------------------------------ expressions mod p


def test_operators_and_evaluation_by_hand():
  assert E.apply_operator(3, '/', 2, 11) == 7  # 2 * 7 = 14 = 3 mod 11
  assert E.apply_operator(2, '-', 5, 11) == 8
  with pytest.raises(ValueError, match='division by zero'):
    E.apply_operator(3, '/', 0, 11)
  assert E.evaluate(_pieces(EXAMPLE[0]), 11) == 9
  assert E.evaluate(_pieces('2+3*4'), 11) == 3  # * first: 14 mod 11
  assert E.evaluate(_pieces('8-3-2'), 11) == 3  # left to right
  assert E.evaluate(_pieces('8/2/2'), 11) == 2
  assert E.evaluate(_pieces('10'), 11) == 10
  for bad in ('3+', '(3', '3)', '()', '3/(2-2)'):
    with pytest.raises(ValueError):
      E.evaluate(_pieces(bad), 11)
  with pytest.raises(ValueError, match='number'):
    E.evaluate(['7'], 5)  # 7 is not a number mod 5


def test_parentheses_rule_by_hand():
  assert E.needs_parentheses(['3', '*', '6', '/', '2'], 2, '-')  # 3*(10-4)/2
  assert not E.needs_parentheses(['3', '*', '3'], 2, '/')  # 3*6/2
  assert E.needs_parentheses(['8', '/', '2'], 2, '*')  # 8/(1*2)
  assert E.needs_parentheses(['8', '-', '2'], 2, '+')  # 8-(1+1)
  assert not E.needs_parentheses(['8', '-', '2'], 2, '*')  # 8-1*2
  assert not E.needs_parentheses(['8', '+', '2'], 0, '-')  # 9-1+2
  assert E.needs_parentheses(['8', '*', '2'], 0, '+')  # (5+3)*2


def test_hand_example_is_a_chain_of_single_reductions():
  chain = [_pieces(s) for s in EXAMPLE]
  assert [E.count_operators(s) for s in chain] == [3, 2, 1, 0]
  assert all(E.is_one_reduction(a, b, 11) for a, b in zip(chain, chain[1:]))
  assert all(python_value(s, 11) == 9 for s in EXAMPLE)
  assert not E.is_one_reduction(chain[0], chain[2], 11)  # two operators at once
  assert not E.is_one_reduction(chain[0], _pieces('3*6/3'), 11)  # value changed
  assert not E.is_one_reduction(chain[0], _pieces('3*6/'), 11)  # malformed


@pytest.mark.parametrize('p', [2, 7, 11])
def test_random_pairs_have_the_requested_value(p):
  rng = np.random.default_rng(p)
  for x in range(p):
    for _ in range(40):
      a, op, b = E.random_pair(rng, x, p)
      assert 0 <= a < p and 0 <= b < p and E.apply_operator(a, op, b, p) == x


@pytest.mark.parametrize('p', [5, 11])
def test_generated_chains_keep_the_value_one_operator_per_step(p):
  rng = np.random.default_rng(p)
  seen_ops = set()
  for num_ops in range(1, 9):
    for _ in range(25):
      chain = E.solution_chain(rng, num_ops, p)
      texts = [''.join(s) for s in chain]
      assert len(chain) == num_ops + 1
      assert [E.count_operators(s) for s in chain] == list(range(num_ops, -1, -1))
      answer = python_value(texts[0], p)
      assert [python_value(t, p) for t in texts] == [answer] * len(chain)
      assert chain[-1] == [str(answer)]
      assert all(E.is_one_reduction(a, b, p) for a, b in zip(chain, chain[1:]))
      assert not any(re.search(r'\(\d+\)', t) for t in texts)  # no '(n)' left over
      assert sum(len(s) for s in chain) + num_ops <= E.max_chain_tokens(num_ops)
      seen_ops.update(t for t in chain[0] if t in E.OPERATORS)
  assert seen_ops == set(E.OPERATORS)


def test_modulus_must_be_a_small_prime():
  assert E.check_modulus(11) == 11
  for bad in (10, 13, 1):
    with pytest.raises(ValueError, match='modulus'):
      E.check_modulus(bad)


# ------------------------------------------------------------------ problems and tokenizer


def test_problem_text_prompt_and_tokens():
  p = A.Problem(EXAMPLE[0], EXAMPLE, 3, 11)
  assert p.text == '3*(10-4)/2=3*6/2=3*3=9'
  assert p.prompt == '3*(10-4)/2='
  assert p.answer == '9'
  tok = A.get_tokenizer(None)
  ids = tok.encode(p.text, add_bos=True, add_eos=True)
  assert [tok.id_to_piece(i) for i in ids] == (
      ['<bos>', '3', '*', '(', '10', '-', '4', ')', '/', '2', '=', '3', '*', '6', '/', '2', '=',
       '3', '*', '3', '=', '9', '<eos>'])
  assert tok.decode(ids) == p.text
  assert tok.vocab_size == len(A.VOCAB) == 21
  assert (tok.bos_id, tok.eos_id) == (1, 2)


def test_tokenizer_errors_and_separators():
  tok = A.ArithmeticTokenizer()
  eq = tok.encode('=')[0]
  assert tok.separator_ids('auto') == (eq,) == tok.separator_ids('official')
  assert tok.separator_ids([3, 4]) == (3, 4)
  with pytest.raises(ValueError, match='characters outside'):
    tok.encode('3^4')
  with pytest.raises(ValueError, match='outside'):
    tok.separator_ids([99])
  with pytest.raises(ValueError, match='rule'):
    tok.separator_ids('sentences')


def test_splits_are_longer_for_eval_and_deterministic():
  s = A.TaskSettings(modulus=11, train_min_ops=1, train_max_ops=3, eval_max_ops=5, seed=3)
  train = A.problems_by_length(s, 'test', 5)
  ev = A.problems_by_length(s, 'eval', 5)
  assert sorted(train) == [1, 2, 3] and sorted(ev) == [4, 5]
  assert all(p.num_ops == n == E.count_operators(_pieces(p.expression))
             for n, ps in ev.items() for p in ps)
  again = A.problems_by_length(s, 'eval', 5)
  assert [p.text for p in ev[5]] == [p.text for p in again[5]]
  with pytest.raises(ValueError, match='split'):
    A.problems_by_length(s, 'validation', 5)


def _cfg(**kw):
  c = ml_collections.ConfigDict({'seq_len': 64, 'seed': 0, 'arithmetic_modulus': 11,
                                 'arithmetic_train_min_ops': 1, 'arithmetic_train_max_ops': 4,
                                 'arithmetic_eval_max_ops': 6})
  c.update(kw)
  return c


@pytest.mark.parametrize('field,value,match', [
    ('arithmetic_modulus', 10, 'data.arithmetic_modulus'),
    ('arithmetic_train_min_ops', 0, 'train_min_ops'),
    ('arithmetic_eval_max_ops', 4, 'eval_max_ops'),
    ('seq_len', 1, 'seq_len'),
])
def test_bad_settings_name_the_field(field, value, match):
  with pytest.raises(ValueError, match=match):
    A.settings_from_config(_cfg(**{field: value}))


def _problems_in_row(row, tok):
  """The complete <bos> ... <eos> problems of a training row, as step lists."""
  out = []
  for part in np.split(row, np.where(row == tok.bos_id)[0][1:]):
    if part[0] == tok.bos_id and part[-1] == tok.eos_id:
      out.append(tok.decode(part).split('='))
  return out


def test_train_rows_are_packed_valid_chains_weighted_towards_more_operators():
  np.testing.assert_allclose(A.settings_from_config(_cfg()).train_ops_probabilities(),
                             [0.1, 0.2, 0.3, 0.4])
  it = A.make_train_iterator(_cfg(), 4, 0, 1)
  tok = A.ArithmeticTokenizer()
  counts = np.zeros(5, int)
  for _ in range(10):
    tokens = next(it)['tokens']
    assert tokens.shape == (4, 64) and tokens.dtype == np.int32
    for row in tokens:
      assert row[0] == tok.bos_id  # every row starts with a whole problem
      for steps in _problems_in_row(row, tok):
        chain = [_pieces(s) for s in steps]
        n = E.count_operators(chain[0])
        counts[n] += 1
        assert 1 <= n <= 4 and len(chain) == n + 1
        assert all(E.is_one_reduction(a, b, 11) for a, b in zip(chain, chain[1:]))
  assert counts[1] > 0 and counts[3] + counts[4] > counts[1] + counts[2]


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


# ------------------------------------------------------------------ the model's view of a problem


def _small_model(encoding='bipe_rope'):
  config = arithmetic_tiny.get_config(encoding)
  m = config.model
  m.hidden_size, m.num_layers, m.num_heads, m.ffn_size = 32, 1, 2, 64
  m.attention_impl = 'dense'
  return model_lib.Transformer(resolve_lib.resolve(
      config, device_count=1, tokenizer=data.get_tokenizer(config.data)).model)


def test_bilevel_positions_of_a_packed_row_by_hand():
  """Each step is one segment ('=' ends it); positions restart at every problem's <bos>."""
  tok = A.ArithmeticTokenizer()
  ids = tok.encode('='.join(EXAMPLE), True, True) + tok.encode('2+5=7', True, True)
  pos = _small_model().compute_positions(jnp.asarray([ids]))
  # <bos> 3 * ( 10 - 4 ) / 2 = | 3 * 6 / 2 = | 3 * 3 = | 9 <eos> || <bos> 2 + 5 = | 7 <eos>
  intra = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 0, 1,
           0, 1, 2, 3, 4, 0, 1]
  inter = [0] * 11 + [1] * 6 + [2] * 4 + [3] * 2 + [0] * 5 + [1] * 2
  np.testing.assert_array_equal(np.asarray(pos.intra[0]), intra)
  np.testing.assert_array_equal(np.asarray(pos.inter[0]), inter)
  np.testing.assert_array_equal(np.asarray(pos.document[0]), [0] * 23 + [1] * 7)


@pytest.mark.parametrize('encoding', ['rope', 'bipe_rope'])
def test_a_packed_problem_is_seen_as_if_alone(encoding):
  """Logits of the second problem of a row equal those of the same problem alone."""
  tok = A.ArithmeticTokenizer()
  first = tok.encode('='.join(EXAMPLE), True, True)
  second = tok.encode('2+5*3=2+4=6', True, True)
  model = _small_model(encoding)
  params = model.init(jax.random.PRNGKey(0), jnp.asarray([first + second]))['params']
  packed = model.apply({'params': params}, jnp.asarray([first + second]))
  alone = model.apply({'params': params}, jnp.asarray([second]))
  np.testing.assert_allclose(packed[0, len(first):], alone[0], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ scoring


def test_score_solution_accepts_any_valid_order_and_checks_every_step():
  tok = A.ArithmeticTokenizer()
  p = A.Problem('2*3+4*5', ('2*3+4*5', '2*3+9', '6+9', '4'), 3, 11)
  gen = lambda text, eos=True: tok.encode(text, add_eos=eos)
  assert acc.score_solution(gen('2*3+9=6+9=4'), p) == (True, True)  # the reference
  assert acc.score_solution(gen('6+4*5=6+9=4'), p) == (True, True)  # another valid order
  assert acc.score_solution(gen('6+9=4'), p) == (True, False)  # skipped a step
  assert acc.score_solution(gen('2*3+9=6+9=5'), p) == (False, False)  # wrong answer
  assert acc.score_solution(gen('2*3+9=6+9=4', eos=False), p) == (False, False)  # no <eos>
  assert acc.score_solution([tok.bos_id] + gen('4'), p) == (False, False)


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
      table[i, len(s_) - 2] = tok.encode(str((int(problems[3][i].answer) + 1) % 11))[0]
    if corrupt == 'step' and i % 2:  # a malformed first solution step, right final answer
      table[i, len(tok.encode(problems[3][i].prompt)) + 1] = tok.encode(')')[0]
  m = min(len(tok.encode(p.prompt)) for p in problems[3]) + 1
  assert len({tuple(x[:m]) for x in seqs}) == 6  # the oracle can tell them apart
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
