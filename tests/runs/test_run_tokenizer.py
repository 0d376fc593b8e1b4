"""A run keeps the tokenizer it was trained with: recorded, used by evaluation, foreign ones refused."""

import json
import os
import shutil
import sys

import pytest

from bipe_jax.runs import tokenizer as run_tokenizer
from bipe_jax.data import preparation
from bipe_jax.evaluation import cli as eval_cli
from bipe_jax.runs import restore as runs_lib
from tests.fixtures import ROOT, cli_env
from tests import forkserver

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope='module')
def run(trained_run):
  """The session's finished bipe_rope run (tests/fixtures.py): read or copied, never changed."""
  return trained_run


def test_training_records_a_copy_and_its_hash(run):
  saved = json.load(open(os.path.join(run, 'config.json'), encoding='utf-8'))
  pinned = os.path.join(run, 'tokenizer.model')
  assert saved['data']['tokenizer_path'] == os.path.abspath(pinned)
  assert saved['data']['tokenizer_sha256'] == run_tokenizer.sha256_of(pinned)
  data_tokenizer = preparation.default_tokenizer_path(_data_config_without_pin(saved))
  assert run_tokenizer.sha256_of(data_tokenizer) == saved['data']['tokenizer_sha256']


def _data_config_without_pin(saved):
  import ml_collections  # pylint: disable=g-import-not-at-top
  data = ml_collections.ConfigDict(saved['data'])
  data.tokenizer_path = ''
  return data


def test_evaluation_on_another_dataset_keeps_the_run_tokenizer(run):
  loaded = runs_lib.load_run(run)
  other = eval_cli.data_config_for(loaded, dataset='embedded', data_dir='/elsewhere')
  assert other.dataset == 'embedded' and other.data_dir == '/elsewhere'
  assert other.tokenizer_path == os.path.abspath(os.path.join(run, 'tokenizer.model'))


def test_a_replaced_tokenizer_is_refused_in_one_line(run, dirs, tmp_path):
  copy = str(tmp_path / 'copy')
  shutil.copytree(run, copy)
  pinned = os.path.join(copy, 'tokenizer.model')
  with open(pinned, 'ab') as f:  # another tokenizer file: same name, other bytes
    f.write(b'\x00')
  proc = forkserver.run(
      [sys.executable, 'eval/perplexity.py', f'--workdir={copy}', '--lengths=32', '--output='],
      cwd=ROOT, env=cli_env(dirs), capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert 'is not the tokenizer run' in last and 'Traceback' not in proc.stderr, proc.stderr
