"""Passkey retrieval: the synthetic task's samples, the teacher-forced scoring (equal to greedy
decoding), the text probe under any tokenizer, and eval/passkey.py end to end."""

import json
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import generation
from bipe_jax import model as model_lib
from bipe_jax import positions as positions_lib
from bipe_jax.evaluation import passkey
from bipe_jax.tasks import passkey as task
from tests.fixtures import tiny_model_config
from tests import fixtures
from tests import forkserver

ROOT = fixtures.ROOT
TOK = task.PasskeyTokenizer()


@pytest.mark.parametrize('length', [40, 64, 200])
def test_samples_by_hand(length):
  rng = np.random.default_rng(0)
  first, last = task.make_sample(rng, length, 0.0), task.make_sample(rng, length, 1.0)
  for s in (first, last):
    assert s.ids.shape == (length,) and s.ids[0] == TOK.bos_id and s.ids[-1] == TOK.eos_id
    pieces = TOK.decode(s.ids).split()
    assert pieces[-7:] == ['?', 'ANS', *s.key]
    assert TOK.decode(s.ids[s.answer_positions]).split() == list(s.key)
    needle = pieces.index('KEY')
    assert pieces[needle:needle + 8] == ['KEY', 'IS', *s.key, '.']
  assert TOK.decode(first.ids).split()[0] == 'KEY'  # depth 0: the first sentence
  last_pieces = TOK.decode(last.ids).split()
  assert last_pieces[last_pieces.index('KEY') + 8] == '?'  # depth 1: just before the question
  with pytest.raises(ValueError, match='too short'):
    task.make_sample(rng, 20)


def test_every_sentence_is_a_segment():
  s = task.make_sample(np.random.default_rng(1), 64, 0.5)
  table = positions_lib.separator_table(TOK.vocab_size, TOK.separator_ids('auto'))
  pos = positions_lib.bilevel_positions(jnp.asarray(s.ids[None]), table)
  periods = int((s.ids == TOK.id_of('.')).sum())
  assert int(pos.inter[0, -1]) == periods  # the question and answer follow the last '.'
  assert TOK.separator_ids('sentence') == (TOK.id_of('.'),)


def test_training_rows_resume_exactly():
  config = {'seq_len': 48, 'seed': 3}

  class Cfg(dict):
    __getattr__ = dict.__getitem__

  it = task.make_train_iterator(Cfg(config), 4)
  batch = next(it)
  first = batch['tokens']
  # The loss is on the answer only: the 5 digits after ANS and <eos>.
  assert (batch['loss_mask'].sum(axis=1) == 6).all() and batch['loss_mask'][:, -6:].all()
  state = it.get_state()
  second = next(it)['tokens']
  again = task.make_train_iterator(Cfg(config), 4)
  again.set_state(state)
  np.testing.assert_array_equal(next(again)['tokens'], second)
  assert first.shape == (4, 48) and not np.array_equal(first, second)


def _tiny_model():
  cfg = tiny_model_config(vocab_size=TOK.vocab_size, separator_ids=TOK.separator_ids('auto'),
                          attention_impl='dense', bos_id=1)
  model = model_lib.Transformer(cfg)
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))['params'])
  return model, params


def test_teacher_forced_scoring_equals_greedy_decoding():
  model, params = _tiny_model()
  apply_fn = lambda p, x: model.apply({'params': p}, x)  # pylint: disable=unnecessary-lambda-assignment
  tokens, positions = passkey.synthetic_rows(48, 0.5, 12, seed=4)
  # Make some rows findable: an oracle key written from the model's own greedy output.
  prompt_len = positions[0, 0]
  greedy = np.asarray(generation.generate(model, params, tokens[:, :prompt_len],
                                          max_new_tokens=5))[:, prompt_len:]
  tokens = tokens.copy()
  tokens[:6, prompt_len:prompt_len + 5] = greedy[:6]
  found = passkey.key_found(apply_fn, params, tokens, positions, batch_size=5)
  want = (greedy == tokens[:, prompt_len:prompt_len + 5]).all(axis=1)
  np.testing.assert_array_equal(found, want)
  assert found[:6].all()


def test_text_probe_rows_under_any_tokenizer():
  class CharTokenizer:
    def encode(self, text):
      return [3 + (ord(c) % 40) for c in text]

  tok = CharTokenizer()
  for depth in (0.0, 0.5, 1.0):
    tokens, positions = passkey.text_rows(tok, 300, depth, 3, seed=1, bos_id=1)
    assert tokens.shape == (3, 300) and (tokens[:, 0] == 1).all()
    for row, pos in zip(tokens, positions):
      key_ids = row[pos]
      assert len(key_ids) == 5
      needle = tok.encode('The pass key is ')
      at = next(i for i in range(len(row)) if list(row[i:i + len(needle)]) == needle)
      assert list(row[at + len(needle):at + len(needle) + 5]) == list(key_ids)
  with pytest.raises(ValueError, match='too short'):
    passkey.text_rows(tok, 50, 0.5, 1)


def test_table_by_hand():
  cells = [passkey.Cell(64, 0.0, 4, 4), passkey.Cell(64, 1.0, 4, 2),
           passkey.Cell(128, 0.0, 4, 1), passkey.Cell(128, 1.0, 4, 0)]
  table = passkey.format_table({'bipe_rope': cells})
  assert '| bipe_rope | 64 | 1.00 | 0.50 | 0.75 |' in table
  assert '| bipe_rope | 128 | 0.25 | 0.00 | 0.12 |' in table


@pytest.mark.slow
def test_train_and_probe_end_to_end(tmp_path):
  workdir = str(tmp_path / 'pk')
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  train = forkserver.run(
      [sys.executable, 'train/main.py', '--config=configs/passkey_tiny.py:bipe_rope',
       f'--workdir={workdir}', '--config.train.steps=4', '--config.train.batch_size=4',
       '--config.checkpoint.every_steps=4', '--config.checkpoint.async_save=False',
       '--config.model.hidden_size=32', '--config.model.ffn_size=64',
       '--config.model.num_layers=2'], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=300)
  assert train.returncode == 0, train.stderr[-2000:]
  out, png = str(tmp_path / 'pk.json'), str(tmp_path / 'pk.png')
  probe = forkserver.run(
      [sys.executable, 'eval/passkey.py', f'--workdir={workdir}', '--lengths=64,128',
       '--depths=0,1', '--trials=3', f'--output={out}', f'--plot={png}'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert probe.returncode == 0, probe.stderr[-2000:]
  assert '| bipe_rope | 128 |' in probe.stdout and os.path.getsize(png) > 1000
  with open(out) as f:
    saved = json.load(f)
  cells = saved['runs'][0]['cells']
  assert [(c['length'], c['depth']) for c in cells] == [(64, 0.0), (64, 1.0), (128, 0.0),
                                                       (128, 1.0)]
  assert all(c['trials'] == 3 and 0 <= c['correct'] <= 3 for c in cells)
  bad = forkserver.run([sys.executable, 'eval/passkey.py', f'--workdir={workdir}',
                        '--depths=2'], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
  assert bad.returncode == 2 and bad.stderr.strip().startswith('error: --depths must be in')
