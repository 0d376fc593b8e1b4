"""Randomized positions (model.randomized_positions; bipe_jax/encodings/randomized.py) against
loop-based NumPy references: the draw, the stream mapping (padding, documents), and the model
(every encoding whose positions enter the computation)."""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import model as model_lib
from bipe_jax import positions as positions_lib
from bipe_jax.config import ModelConfig
from bipe_jax.encodings import randomized


# ---------------------------------------------------------------- references (loops, NumPy)

def reference_draw(key, counts, length, big_l):
  """Row by row: the row's key (fold_in(key, row)), a permutation of 0..L-1, its first count
  entries sorted, then L."""
  out = np.full((len(counts), length), big_l, np.int64)
  for b, count in enumerate(counts):
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, b), big_l))
    chosen = sorted(int(x) for x in perm[:count])
    for j, x in enumerate(chosen):
      out[b, j] = x
  return out


def reference_randomize(key, stream, valid, document, big_l):
  """Walks each row's valid tokens: numbers the stream's values across the row (a new document
  is a new value when documents restart), maps value g to the g-th of an ordered draw, and
  subtracts the value at the document's first token when documents restart."""
  stream, valid = np.asarray(stream), np.asarray(valid)
  b, t = stream.shape
  g = np.zeros((b, t), np.int64)
  counts = []
  for r in range(b):
    index, prev_s, prev_d, seen = 0, None, None, False
    for i in range(t):
      if not valid[r, i]:
        continue
      if seen:
        if document is not None and document[r, i] != prev_d:
          index += 1
        else:
          index += int(stream[r, i]) - prev_s
      g[r, i] = index
      prev_s, seen = int(stream[r, i]), True
      prev_d = None if document is None else document[r, i]
    counts.append(index + 1 if seen else 0)
  draw = reference_draw(key, counts, t, big_l)
  out = np.zeros((b, t), np.int64)
  for r in range(b):
    start_value, prev_d, seen = 0, None, False
    for i in range(t):
      if not valid[r, i]:
        continue
      value = draw[r, g[r, i]]
      if document is not None and (not seen or document[r, i] != prev_d):
        start_value = value
      out[r, i] = value - (start_value if document is not None else 0)
      prev_d, seen = (None if document is None else document[r, i]), True
  return out


# ---------------------------------------------------------------- the draw

def test_ordered_draw_matches_the_loop_reference_and_is_an_ordered_subset():
  key = jax.random.PRNGKey(3)
  counts = np.array([6, 1, 0, 4, 6])
  draw = np.asarray(randomized.ordered_draw(key, jnp.asarray(counts), 6, 50))
  chex.assert_shape(draw, (5, 6))
  np.testing.assert_array_equal(draw, reference_draw(key, counts, 6, 50))
  for row, count in zip(draw, counts):
    kept = row[:count]
    assert np.all(np.diff(kept) > 0) and np.all((kept >= 0) & (kept < 50))
    assert np.all(row[count:] == 50)
  assert len({tuple(r) for r, c in zip(draw, counts) if c == 6}) == 2  # one draw per row
  again = np.asarray(randomized.ordered_draw(key, jnp.asarray(counts), 6, 50))
  np.testing.assert_array_equal(draw, again)  # same key, same draw
  other = np.asarray(randomized.ordered_draw(jax.random.PRNGKey(4), jnp.asarray(counts), 6, 50))
  assert not np.array_equal(draw, other)
  # a longer (more padded) row, or a batch with more rows after it, draws the same positions
  longer = np.asarray(randomized.ordered_draw(key, jnp.asarray([*counts, 3]), 9, 50))
  np.testing.assert_array_equal(longer[:5, :6], draw)
  assert np.all(longer[:5, 6:] == 50)


def test_ordered_draw_is_uniform_over_the_subsets():
  """3 of 0..5: each of the 20 subsets about 1/20 of 4000 rows (chi-square, 19 dof, p~1e-4)."""
  rows = 4000
  draw = np.asarray(randomized.ordered_draw(jax.random.PRNGKey(0), jnp.full((rows,), 3), 3, 6))
  freq = {s: 0 for s in itertools.combinations(range(6), 3)}
  for row in draw:
    freq[tuple(int(x) for x in row)] += 1
  expected = rows / 20
  chi2 = sum((n - expected) ** 2 / expected for n in freq.values())
  assert chi2 < 50, freq


def test_ordered_draw_with_l_equal_to_the_row_length_is_the_ordinary_positions():
  draw = np.asarray(randomized.ordered_draw(jax.random.PRNGKey(1), jnp.array([7, 7]), 7, 7))
  np.testing.assert_array_equal(draw, np.tile(np.arange(7), (2, 1)))


# ---------------------------------------------------------------- streams: padding, documents

SEP, BOS, PAD = 5, 1, 0


def _positions(tokens, restart):
  return positions_lib.bilevel_positions(
      jnp.asarray(tokens, jnp.int32), positions_lib.separator_table(10, (SEP,)),
      document_start_table_V=positions_lib.separator_table(10, (BOS,)), pad_id=PAD,
      restart_at_documents=restart)


TOKENS = [[2, 3, 5, 4, 5, 6, 7, 0, 0],    # right padding
          [0, 0, 2, 5, 3, 3, 5, 4, 4],    # left padding
          [2, 0, 3, 5, 0, 4, 5, 0, 6],    # interior padding
          [2, 5, 1, 3, 5, 4, 1, 6, 0],    # documents (a leading partial one, then two BOS)
          [0, 0, 0, 0, 0, 0, 0, 0, 0]]    # all padding


@pytest.mark.parametrize('restart', [False, True])
@pytest.mark.parametrize('name', ['token', 'inter'])
def test_randomize_stream_matches_the_loop_reference(name, restart):
  pos = _positions(TOKENS, restart)
  key = jax.random.PRNGKey(7)
  documents = pos.document if restart else None
  got = randomized.randomize_stream(key, getattr(pos, name), pos.valid, 40, documents)
  chex.assert_shape(got, (5, 9))
  want = reference_randomize(key, getattr(pos, name), pos.valid,
                             None if documents is None else np.asarray(documents), 40)
  np.testing.assert_array_equal(np.asarray(got), want)
  got, valid, doc = np.asarray(got), np.asarray(pos.valid), np.asarray(pos.document)
  assert np.all(got[~valid] == 0) and np.all((got >= 0) & (got < 40))
  if name == 'token':  # strictly increasing inside each document (the whole row: no restart)
    for r in range(5):
      for d in np.unique(doc[r][valid[r]]):
        seq = got[r][valid[r] & ((doc[r] == d) if restart else True)]
        assert np.all(np.diff(seq) > 0), (r, seq)
        if restart:
          assert seq[0] == 0  # documents restart at 0, as the ordinary streams do


def test_randomize_positions_keeps_intra_and_is_the_same_under_jit():
  pos = _positions(TOKENS, False)
  key = jax.random.PRNGKey(2)
  eager = randomized.randomize_positions(pos, key, 32, ('token', 'inter'))
  jitted = jax.jit(lambda p, k: randomized.randomize_positions(p, k, 32, ('token', 'inter')))(
      pos, key)
  for name in ('token', 'intra', 'inter', 'document', 'valid'):
    chex.assert_shape(getattr(eager, name), (5, 9))
    np.testing.assert_array_equal(getattr(eager, name), getattr(jitted, name))
  np.testing.assert_array_equal(eager.intra, pos.intra)
  np.testing.assert_array_equal(eager.document, pos.document)
  assert not np.array_equal(eager.token, pos.token)
  only_inter = randomized.randomize_positions(pos, key, 32, ('inter',))
  np.testing.assert_array_equal(only_inter.token, pos.token)
  np.testing.assert_array_equal(only_inter.inter, eager.inter)
  with pytest.raises(ValueError, match='row of 9 tokens'):
    randomized.randomize_positions(pos, key, 8)


# ---------------------------------------------------------------- the model

ENCODINGS = ['rope', 'alibi', 'kerple', 'fire', 't5', 'dape_kerple', 'learned', 'sinusoidal',
             'bipe_rope', 'bipe_alibi']


def _config(encoding, big_l, **kw):
  return ModelConfig(vocab_size=12, hidden_size=16, num_layers=1, num_heads=2, ffn_size=32,
                     position_encoding=encoding, separator_ids=(SEP,), max_intra=16,
                     max_position=16, train_length=8, bos_id=-1, eos_id=-1,
                     attention_impl='dense', randomized_positions=big_l, **kw)


def _logits(cfg, tokens, key=None, positions=None):
  module = model_lib.Transformer(cfg)
  params = module.init(jax.random.PRNGKey(0), tokens)['params']
  # weights x 8: attention far from uniform, so positions move the logits well above rounding
  params = jax.tree.map(lambda x: 8 * x, params)
  return np.asarray(module.apply({'params': params}, tokens, positions=positions,
                                 positions_rng=key))


@pytest.mark.parametrize('encoding', ENCODINGS)
def test_model_takes_the_randomized_positions(encoding):
  """With L = the row length (and, for BiPE, every token its own segment: as many segments as
  L) the logits are the ordinary ones; with L > T they are those of the model given the
  reference's positions, and differ from the ordinary ones."""
  bipe = encoding.startswith('bipe')
  tokens = (jnp.full((2, 8), SEP, jnp.int32) if bipe else
            jnp.array([[2, 3, 5, 4, 6, 5, 7, 8], [9, 5, 5, 3, 2, 4, 4, 6]], jnp.int32))
  key = jax.random.PRNGKey(11)
  cfg = _config(encoding, 8)
  np.testing.assert_allclose(_logits(cfg, tokens, key), _logits(cfg, tokens), atol=2e-5)

  tokens = jnp.array([[2, 3, 5, 4, 6, 5, 7, 8], [9, 5, 5, 3, 2, 4, 4, 6]], jnp.int32)
  cfg = _config(encoding, 64)
  pos = model_lib.Transformer(cfg).apply({}, tokens,
                                         method=model_lib.Transformer.compute_positions)
  stream = 'inter' if bipe else 'token'
  want = reference_randomize(jax.random.split(key, 3)[randomized.STREAMS.index(stream)],
                             getattr(pos, stream), pos.valid, None, 64)
  given = pos.replace(**{stream: jnp.asarray(want, jnp.int32)})
  randomized_logits = _logits(cfg, tokens, key)
  chex.assert_shape(randomized_logits, (2, 8, 12))
  np.testing.assert_allclose(randomized_logits, _logits(cfg, tokens, positions=given),
                             atol=2e-5)
  assert np.abs(randomized_logits - _logits(cfg, tokens)).max() > 2e-3


def test_model_without_a_key_keeps_the_ordinary_positions():
  cfg = _config('rope', 64)
  tokens = jnp.array([[2, 3, 5, 4]], jnp.int32)
  module = model_lib.Transformer(cfg)
  params = module.init(jax.random.PRNGKey(0), tokens)['params']
  plain = module.apply({'params': params}, tokens)
  off = _config('rope', 0)
  np.testing.assert_allclose(plain, model_lib.Transformer(off).apply({'params': params}, tokens),
                             atol=1e-6)


def test_learned_absolute_table_has_l_rows():
  module = model_lib.Transformer(_config('learned', 40))
  params = module.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))['params']
  chex.assert_shape(params['abs_embed']['embedding'], (40, 16))


@pytest.mark.parametrize('encoding', ['fox', 'fox_bias_only', 'bipe_fox', 'cope'])
def test_schemes_without_token_positions_refuse_it(encoding):
  with pytest.raises(ValueError, match=r'model\.randomized_positions=64 is invalid: .*no token '
                                       'positions'):
    _config(encoding, 64)


def test_negative_l_is_refused():
  with pytest.raises(ValueError, match=r'randomized_positions=-1 is invalid: .*>= 0 \(0 = off'):
    _config('rope', -1)


# ---------------------------------------------------------------- the LM train step

@pytest.mark.parametrize('accum', [1, 2])
def test_train_step_draws_from_fold_in_of_the_state_rng_and_step(accum):
  """The step's loss is the loss at the positions drawn from fold_in(state.rng, step) (and, for
  micro-batch j of an accumulated step, fold_in of that and j): the same step draws the same."""
  import optax  # pylint: disable=import-outside-toplevel
  from configs import base  # pylint: disable=import-outside-toplevel
  from bipe_jax.state import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  from bipe_jax.state import train_state  # pylint: disable=import-outside-toplevel
  from bipe_jax.training import train_step  # pylint: disable=import-outside-toplevel
  cfg = _config('rope', 64)
  model = model_lib.Transformer(cfg)
  mesh = mesh_lib.make_mesh(base.get_base_config().mesh, devices=jax.devices()[:1])
  tx = optax.sgd(0.0)
  tokens = jnp.asarray(np.random.default_rng(0).integers(2, 12, (4, 8)), jnp.int32)
  state, shardings = train_state.create_train_state(model, tx, mesh, 8, seed=0)
  state = state.replace(params=jax.tree.map(lambda x: 8 * x, state.params))  # as _logits
  step = train_step.make_train_step(model, tx, lambda s: 0.0, mesh, shardings,
                                    grad_accum_steps=accum, loss_chunk_tokens=0)
  params, rng = jax.device_get(state.params), jax.device_get(state.rng)
  losses = []
  with train_state.mesh_context(mesh):
    for _ in range(2):
      state, metrics = step(state, {'tokens': tokens})
      losses.append(float(metrics['loss']))
  total = count = 0.0
  for j in range(accum):
    key = jax.random.fold_in(rng, 1)  # the second step (step 1)
    if accum > 1:
      key = jax.random.fold_in(key, j)
    micro = tokens[j::accum]
    logits = model.apply({'params': params}, micro, positions_rng=key)
    nll, n = train_step.next_token_nll(logits, micro)
    total, count = total + float(nll), count + float(n)
  np.testing.assert_allclose(losses[1], total / count, rtol=1e-5)
  assert abs(losses[0] - losses[1]) > 1e-3  # sgd(0): only the draw changed between the steps


# ---------------------------------------------------------------- the CHE harness

def test_che_rows_draw_the_same_positions_however_far_they_are_padded():
  from bipe_jax.che import batches  # pylint: disable=import-outside-toplevel
  from bipe_jax.che import model as che_model  # pylint: disable=import-outside-toplevel
  from bipe_jax.tasks import che as tasks  # pylint: disable=import-outside-toplevel
  task = tasks.get_task('reverse_string')
  cfg = che_model.che_model_config(task, 'rope', max_tokens=64, num_layers=1, hidden_size=16,
                                   num_heads=2, randomized_positions=64)
  module = model_lib.Transformer(cfg)
  params = jax.tree.map(lambda x: 8 * x, che_model.init_params(module, 0))
  rows = task.sample(np.random.default_rng(0), 2, 5)
  key = jax.random.PRNGKey(5)
  logits = lambda b, k: np.asarray(jax.jit(  # pylint: disable=g-long-lambda
      lambda b, k: che_model.output_logits(module, params, b, task.output_size,
                                           positions_rng=k))(b, k))
  exact = batches.pack(task, [rows], 'task', 10, 5)
  longer = batches.pack(task, [rows, task.sample(np.random.default_rng(1), 2, 20)], 'task', 64,
                        20)
  drawn = logits(exact, key)
  np.testing.assert_allclose(logits(longer, key)[:2, :5], drawn, atol=2e-5)
  assert np.abs(drawn - logits(exact, None)).max() > 2e-3  # the draw moved the logits
  with pytest.raises(ValueError, match='row of 65 tokens'):
    logits(batches.pack(task, [rows], 'task', 65, 5), key)


def test_che_cell_refuses_a_short_l_and_a_grid_refuses_to_mix_l(tmp_path, monkeypatch):
  from bipe_jax.che import cell  # pylint: disable=import-outside-toplevel
  from bipe_jax.che import sweep  # pylint: disable=import-outside-toplevel
  from bipe_jax.che import training  # pylint: disable=import-outside-toplevel
  from bipe_jax.tasks import che as tasks  # pylint: disable=import-outside-toplevel
  budget, plan = training.Budget(steps=1), cell.EvalPlan(lengths='1,100', bucket=64)
  task = tasks.get_task('reverse_string')
  cell.check_randomized_positions(256, task, (1, 100), budget, plan)  # rows of 200 -> 256
  with pytest.raises(ValueError, match='--randomized_positions=200 must be at least 256'):
    cell.check_randomized_positions(200, task, (1, 100), budget, plan)
  seen = []

  def fake_cell(task_name, encoding, seed, budget, plan, **settings):
    import dataclasses  # pylint: disable=import-outside-toplevel
    seen.append(settings['randomized_positions'])
    return dict(task=task_name, level='dcf', encoding=encoding, seed=seed, segmentation='n/a',
                score=0.5, in_distribution=1.0, scored_lengths='x', accuracy={'1': 1.0},
                budget=dataclasses.asdict(budget), eval=dataclasses.asdict(plan),
                architecture=settings.get('architecture', 'project'),
                randomized_positions=settings['randomized_positions'])
  monkeypatch.setattr(cell, 'run_cell', fake_cell)
  out = str(tmp_path)
  sweep.run_grid(['reverse_string'], ['rope'], [0], budget, plan, out, say=lambda _: None,
                 randomized_positions=256)
  assert seen == [256]
  with open(sweep.cell_path(out, 'reverse_string', 'rope', 0)) as f:
    assert '"randomized_positions": 256' in f.read()
  with pytest.raises(ValueError, match="'randomized_positions': 256"):
    sweep.run_grid(['reverse_string'], ['rope'], [0], budget, plan, out, say=lambda _: None)


def test_a_run_refuses_rows_longer_than_l():
  import dataclasses  # pylint: disable=import-outside-toplevel
  from configs import base  # pylint: disable=import-outside-toplevel
  from bipe_jax import run_config  # pylint: disable=import-outside-toplevel
  from bipe_jax.training import resolve  # pylint: disable=import-outside-toplevel
  config = base.get_base_config()
  data = dataclasses.replace(run_config.section_from_dict('data', config.data), seq_len=128)
  mesh = run_config.section_from_dict('mesh', config.mesh)
  resolve.check_randomized_positions(_config('rope', 128), data, mesh, 1)
  with pytest.raises(run_config.ConfigError, match=r'randomized_positions.*>= data\.seq_len=128'):
    resolve.check_randomized_positions(_config('rope', 64), data, mesh, 1)
