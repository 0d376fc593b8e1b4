"""Separators resolved once, from the tokenizer and the dataset's kind, and recorded with the run."""

import json
import os

import pytest

from bipe_jax.data import preparation
from bipe_jax.data import tokenizer as tokenizer_lib
from bipe_jax import run_config
from bipe_jax.training import resolve as resolve_lib
from configs import base

from tests.fixtures import ROOT, cli_args, cli_env
from tests import forkserver


class FakeSentencePiece:
  """A 32000-piece vocabulary whose ids 869 and 13 are not the Llama tokenizer's pieces."""

  def __init__(self, pieces):
    self._pieces = pieces

  def GetPieceSize(self):  # pylint: disable=invalid-name
    return 32000

  def IdToPiece(self, i):  # pylint: disable=invalid-name
    return self._pieces.get(int(i), f'p{i}')


def fake_tokenizer(pieces):
  tok = tokenizer_lib.Tokenizer.__new__(tokenizer_lib.Tokenizer)
  tok.path, tok._sp = 'self_trained.model', FakeSentencePiece(pieces)  # pylint: disable=protected-access
  return tok


def test_official_ids_only_with_the_official_pieces():
  llama = fake_tokenizer({869: '\u2581.', 13: '<0x0A>'})
  assert llama.separator_ids('official') == (13, 869)
  own = fake_tokenizer({869: '\u2581which', 13: '<0x09>'})
  with pytest.raises(ValueError, match=r"in self_trained.model they are \['<0x09>', '▁which'\]|"
                                       r"they are \['▁which', '<0x09>'\]"):
    own.separator_ids('official')
  assert own.separator_ids([869, 13]) == (13, 869)  # explicit ids: the user's override


def test_code_folders_default_to_newlines(tmp_path):
  code, prose = tmp_path / 'code', tmp_path / 'prose'
  code.mkdir()
  prose.mkdir()
  (code / 'a.py').write_text('x = 1\n')
  (code / 'b.js').write_text('let y = 2;\n')
  (prose / 'a.txt').write_text('Hello. World!\n')
  (prose / 'b.py').write_text('z = 3\n')
  def rule(text_dir, dataset='text_folder'):
    c = base.data_defaults()
    c.dataset, c.text_dir = dataset, str(text_dir)
    return preparation.default_separator_rule(c)
  assert rule(code) == 'newline'
  assert rule(prose) == 'sentence'  # mixed folders are text
  assert rule('', 'embedded') == 'sentence'


class ToyTokenizer:
  path = 'toy.model'
  vocab_size, bos_id, eos_id = 8, 1, 2

  def separator_ids(self, rule):
    return {'sentence': (5, 6), 'newline': (6,)}[rule]


def toy_config(**model):
  c = base.get_base_config()
  c.model.vocab_size = 8
  for k, v in model.items():
    c.model[k] = v
  return c


def _resolve(config, **facts):
  return resolve_lib.resolve(config, device_count=1, **facts)


def test_resolution_follows_the_dataset_kind_and_checks_bos_eos(tmp_path):
  c = toy_config()
  resolved = _resolve(c, tokenizer=ToyTokenizer())
  assert resolved.model.separator_ids == (5, 6)
  assert resolved.to_config_dict().model.separator_ids == (5, 6)  # the run records the ids
  assert c.model.separator_ids == ()  # the config itself is not edited
  (tmp_path / 'a.py').write_text('x\n')
  c = toy_config()
  c.data.dataset, c.data.text_dir = 'text_folder', str(tmp_path)
  assert _resolve(c, tokenizer=ToyTokenizer()).model.separator_ids == (6,)
  with pytest.raises(run_config.ConfigError, match=r'model.bos_id=3 does not match the '
                                                          r'tokenizer toy.model \(bos_id 1\)'):
    _resolve(toy_config(bos_id=3), tokenizer=ToyTokenizer())
  with pytest.raises(run_config.ConfigError, match='model.eos_id=-1'):
    _resolve(toy_config(eos_id=-1), tokenizer=ToyTokenizer())


def test_derived_lengths_follow_seq_len_unless_set():
  c = base.get_base_config()
  c.data.seq_len = 64
  c.model.rope_original_length = 512
  model = _resolve(c).model  # separators resolved later: not needed for the lengths
  assert (model.train_length, model.rope_original_length) == (64, 512)
  c.model.rope_original_length = 0  # a fine-tune's: its source's data.seq_len
  model = _resolve(c, init_source_seq_len=32).model
  assert (model.train_length, model.rope_original_length) == (64, 32)


@pytest.mark.slow
def test_151m_preset_on_a_self_trained_tokenizer(dirs, tmp_path):
  """The flagship preset, shrunk, on data with its own tokenizer: correct separators, and a
  clear error for the official ids."""
  shrink = ('--config.train.steps=1', '--config.checkpoint.every_steps=1',
            '--config.checkpoint.async_save=False', '--config.train.warmup_steps=1')
  def run(workdir, *extra):
    args = cli_args(dirs, workdir, *shrink, *extra)
    args[2] = '--config=configs/bipe_rope_151m.py'  # instead of the tiny preset
    return forkserver.run(args, cwd=ROOT, env=cli_env(dirs), capture_output=True, text=True,
                          timeout=300)
  workdir = str(tmp_path / 'ok')
  proc = run(workdir)
  assert proc.returncode == 0, proc.stderr[-2000:]
  saved = json.load(open(os.path.join(workdir, 'config.json'), encoding='utf-8'))
  tok = tokenizer_lib.Tokenizer(saved['data']['tokenizer_path'])
  assert tuple(saved['model']['separator_ids']) == tok.separator_ids('sentence')
  assert saved['model']['train_length'] == saved['model']['rope_original_length'] == 32
  proc = run(str(tmp_path / 'official'), '--config.model.separators=official')
  assert proc.returncode == 2
  last = proc.stderr.strip().splitlines()[-1]  # no Llama tokenizer given
  assert last.startswith("config error: model.separators='official' means ids (869, 13) of the "
                         'Llama tokenizer: set data.tokenizer_path')
  proc = run(str(tmp_path / 'official2'), '--config.model.separators=official',
             f'--config.data.tokenizer_path={saved["data"]["tokenizer_path"]}')
  assert proc.returncode == 2
  last = proc.stderr.strip().splitlines()[-1]  # (this vocabulary has no id 869 at all)
  assert last == ('config error: model.separator_ids=(869, 13) is invalid: ids [869] are out of '
                  'range: allowed 0..319.')
  assert 'Traceback' not in proc.stderr
