"""SCROLLS-style fine-tuning: metrics against hand-computed values, rows whose loss is on the
output only, the loss mask in the training step, and fine-tune + scoring end to end on a
generated set in the SCROLLS schema."""

import json
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax.evaluation import scrolls
from bipe_jax.tasks import scrolls as task
from bipe_jax.training import train_step as train_step_lib
from tests import fixtures
from tests import forkserver

ROOT = fixtures.ROOT


def test_exact_match_and_f1_by_hand():
  assert scrolls.exact_match('The Cat.', 'cat') == 1.0
  assert scrolls.exact_match('a cat', 'dog') == 0.0
  assert scrolls.token_f1('red car', 'a red bus') == pytest.approx(0.5)
  assert scrolls.token_f1('red red car', 'red') == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
  assert scrolls.token_f1('', '') == 1.0 and scrolls.token_f1('x', '') == 0.0


def test_rouge_geometric_mean_by_hand():
  # unigrams: P 4/4, R 4/6 -> F 0.8; bigrams: 2 common of 3 and 5 -> F 0.5; LCS 4 -> F 0.8
  got = scrolls.rouge_geometric_mean('cat sat on mat', 'the cat sat on the mat')
  assert got == pytest.approx((0.8 * 0.5 * 0.8) ** (1 / 3), rel=1e-6)
  assert scrolls.rouge_geometric_mean('the cat', 'the cat') == pytest.approx(1.0)


def test_score_takes_the_best_reference_per_id():
  refs = {'a': ['red', 'blue'], 'b': ['green']}
  result = scrolls.score('quality', {'a': 'Blue', 'b': 'red'}, refs)
  assert result == {'metric': 'exact_match', 'score': 50.0, 'count': 2}
  assert scrolls.score('qasper', {'a': 'red', 'b': 'green'}, refs)['score'] == 100.0


def test_truncation_by_hand():
  ids = list(range(10))
  assert task.truncate(ids, 4, 'end') == [0, 1, 2, 3]
  assert task.truncate(ids, 4, 'front') == [6, 7, 8, 9]
  assert task.truncate(ids, 5, 'middle') == [0, 1, 2, 8, 9]
  assert task.truncate(ids, 20, 'middle') == ids


class WordTokenizer:
  """One id per distinct whitespace word (ids from 3); bos 1, eos 2."""
  bos_id, eos_id = 1, 2

  def __init__(self):
    self.words = {}

  def encode(self, text):
    return [self.words.setdefault(w, 3 + len(self.words)) for w in text.split()]


def test_training_row_scores_the_output_only():
  tok = WordTokenizer()
  s = {'seq_len': 16, 'max_output': 4, 'truncate': 'front'}
  example = {'id': 'x', 'input': ' '.join(f'w{i}' for i in range(30)), 'output': 'yes it is'}
  row = task.training_row(tok, example, s)
  tokens, mask = row['tokens'], row['loss_mask']
  answer = tok.encode('yes it is') + [2]
  sep = tok.encode(task.SEPARATOR)
  n = 16 - len(answer)
  assert tokens[0] == 1 and list(tokens[n - len(sep):n]) == sep
  assert list(tokens[1:n - len(sep)]) == tok.encode(' '.join(f'w{i}' for i in range(30)))[
      -(n - len(sep) - 1):]  # 'front': the end of the input is kept
  assert list(tokens[n:]) == answer and list(np.flatnonzero(mask)) == list(range(n, 16))


def test_loss_mask_scores_only_masked_targets():
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 7))
  tokens = jnp.array([[1, 2, 3, 4, 5], [6, 5, 4, 3, 2]])
  mask = jnp.array([[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]], bool)
  total, count = train_step_lib.next_token_nll(logits, tokens, loss_mask_BxT=mask)
  logp = jax.nn.log_softmax(logits)
  want = sum(-float(logp[b, t - 1, tokens[b, t]]) for b in range(2) for t in range(1, 5)
             if mask[b, t])
  assert float(count) == 4 and float(total) == pytest.approx(want, rel=1e-5)


def test_read_examples_errors(tmp_path):
  class Cfg(dict):
    __getattr__ = dict.__getitem__

  cfg = Cfg(seq_len=512, scrolls_jsonl=str(tmp_path), scrolls_subset="qasper", data_dir="")
  with pytest.raises(ValueError, match='has no train.jsonl'):
    task.read_examples(cfg, 'train')
  (tmp_path / 'train.jsonl').write_text('{"id": "1", "input": "x"}\n')
  with pytest.raises(ValueError, match=r"missing fields \['output'\]"):
    task.read_examples(cfg, 'train')
  tfds_cfg = Cfg(seq_len=512, scrolls_jsonl="", scrolls_subset="qasper",
                 data_dir=str(tmp_path / 'tfds'))
  with pytest.raises(ValueError, match='tfds build scrolls/qasper'):
    task.read_examples(tfds_cfg, 'validation')
  with pytest.raises(ValueError, match='scrolls_subset'):
    task.settings(Cfg(seq_len=512, scrolls_subset="nope"))


def write_set(folder, rng, count):
  """Questions about a colour named in the input; the answer is the colour."""
  colours = ['red', 'blue', 'green', 'black']
  os.makedirs(folder, exist_ok=True)
  for split, n in (('train', count), ('validation', 6)):
    with open(os.path.join(folder, f'{split}.jsonl'), 'w') as f:
      for i in range(n):
        c = colours[int(rng.integers(4))]
        f.write(json.dumps({'id': f'{split}-{i}', 'pid': f'{split}-{i}-0',
                            'input': f'The box is {c}. What colour is the box?',
                            'output': c}) + '\n')


@pytest.mark.slow
def test_fine_tune_and_score_end_to_end(trained_rope_run, tmp_path):
  source = trained_rope_run  # the session's rope run (tests/fixtures.py)
  data = str(tmp_path / 'qasper')
  write_set(data, np.random.default_rng(0), 64)
  workdir = str(tmp_path / 'tuned')
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  train = forkserver.run(
      [sys.executable, 'train/main.py', f'--config=configs/scrolls_finetune.py:{source}',
       f'--workdir={workdir}', f'--config.data.scrolls_jsonl={data}',
       '--config.data.seq_len=48', '--config.data.scrolls_max_output_tokens=8',
       '--config.train.steps=4', '--config.train.batch_size=4',
       '--config.checkpoint.every_steps=4', '--config.checkpoint.async_save=False'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert train.returncode == 0, train.stderr[-3000:]
  assert f'parameters from {source}' in train.stdout
  out = str(tmp_path / 'r.json')
  proc = forkserver.run(
      [sys.executable, 'eval/scrolls.py', f'--workdir={workdir}', '--max_new_tokens=4',
       f'--output={out}'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'qasper validation: f1 ' in proc.stdout and 'over 6 ids' in proc.stdout
  with open(out) as f:
    saved = json.load(f)
  assert sorted(saved['answers']) == [f'validation-{i}' for i in range(6)]
  refs = {f'validation-{i}': [] for i in range(6)}
  with open(os.path.join(data, 'validation.jsonl')) as f:
    for line in f:
      row = json.loads(line)
      refs[row['id']].append(row['output'])
  want = 100 * np.mean([max(scrolls.token_f1(saved['answers'][i], r) for r in refs[i])
                        for i in refs])
  assert math.isclose(saved['score'], want, rel_tol=1e-9)
