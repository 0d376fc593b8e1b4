"""End to end: the embedded corpus and the data CLIs (slow: a few seconds each)."""

import json
import os
import sys

import numpy as np
import pytest

import bipe_jax.data as data_lib
from bipe_jax.data import embedded_corpus
from configs import base
from tests.data import test_data_builders as corpus
from tests import fixtures
from tests import forkserver

ROOT = fixtures.ROOT


@pytest.mark.slow
def test_embedded_corpus_prepare_iterate_evaluate(tmp_path):
  c = base.data_defaults()
  c.data_dir = str(tmp_path)
  prepared = data_lib.prepare(c)
  assert prepared.version_dir.endswith(f'{embedded_corpus.version_tag()}_val050/1.0.0')
  report = data_lib.tfds_builders.read_report(c)
  assert report['documents']['train'] > 300 and report['documents']['validation'] > 10
  tok = data_lib.get_tokenizer(c)
  data_lib.check_vocab_size(tok, 4096)  # the tiny preset's model.vocab_size
  newline = tok.encode('\n')
  assert len(newline) == 1 and newline[0] in tok.separator_ids('auto')
  text = 'def f(x):\n    """Doc."""\n    return x\n'
  assert tok.decode(tok.encode(text)) == text
  # Separators on the real pieces of the embedded tokenizer (issue: decimal points,
  # abbreviations and code punctuation used to end segments).
  sep = set(tok.separator_ids('sentence'))
  def separators_in(text):
    return [tok.id_to_piece(i) for i in tok.encode(text) if i in sep]
  assert separators_in('It is 3.5 units, e.g. this one') == []
  assert separators_in('x = y if re.match(r"(?P<n>a)", s) != None else {!r}') == []
  assert separators_in('Really? Yes! Done.\n') == ['?', '!', '\n']
  assert separators_in('He said "stop." (See the docs.)') == ['."', '.)']
  it = data_lib.make_train_iterator(c, 4)
  batch = next(it)
  it.close()
  assert batch['tokens'].shape == (4, 128) and batch['tokens'].dtype == np.int32
  tokens, mask = data_lib.make_eval_blocks(c, 1024)
  assert tokens.shape[0] >= 50 and mask[:, 1:].all()


def run_cli(script, *args):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  return forkserver.run([sys.executable, os.path.join(ROOT, 'train', script), *args],
                        capture_output=True, text=True, env=env, timeout=300, check=False)


@pytest.mark.slow
def test_build_data_and_train_tokenizer_clis(tmp_path):
  corpus.write_corpus(tmp_path / 'texts', 30)
  common = ['--dataset=text_folder', f'--text_dir={tmp_path / "texts"}',
            f'--data_dir={tmp_path / "data"}']
  out = run_cli('build_data.py', *common, '--vocab_size=340')
  assert out.returncode == 0, out.stderr
  lines = out.stdout.strip().splitlines()  # a few lines, not the build report
  assert len(lines) == 4 and lines[0].startswith('text_folder: built in '), lines
  assert lines[0].endswith(' (28 train / 2 validation documents)'), lines
  assert lines[1].startswith('tokenizer: ') and 'vocabulary 340' in lines[1], lines
  assert not out.stderr.strip(), out.stderr  # library INFO logs stay off the terminal
  out = run_cli('build_data.py', *common, '--vocab_size=340', '--json')
  assert out.returncode == 0, out.stderr
  summary = json.loads(out.stdout[out.stdout.index('{'):])
  assert not summary['built'] and not summary['trained_tokenizer']  # reused
  assert summary['vocab_size'] == 340
  assert summary['report']['documents']['train'] + summary['report']['documents']['validation'] == 30
  assert summary['train_tokens'] > 1000
  out = run_cli('train_tokenizer.py', *common, '--model_type=unigram', '--vocab_size=350',
                f'--output={tmp_path / "u.model"}')
  assert out.returncode == 0, out.stderr
  assert json.loads(out.stdout[out.stdout.index('{'):])['vocab_size'] == 350
  out = run_cli('build_data.py', '--dataset=pg19', f'--data_dir={tmp_path / "none"}')
  assert out.returncode == 2 and out.stderr.count('\n') == 1, out.stderr
  assert 'tfds build pg19' in out.stderr and '--file_format=array_record' in out.stderr
