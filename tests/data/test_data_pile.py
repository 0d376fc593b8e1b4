"""The Pile-format reader (bipe_jax/data/pile.py) and its dataset (dataset='pile').

The tests write a small folder in the Pile's layout (train/00.jsonl.zst, train/01.jsonl,
val.jsonl.zst, test.jsonl) whose records they know, and check the reader against a plain loop
over those records: subset selection by meta.pile_set_name, splits by file, skipped lines
counted. The slow test trains the paper preset (configs/paper_151m.py), shrunk by flags, for
3 steps on such a folder through train/main.py.
"""

import json
import os
import sys
import types

import numpy as np
import pytest

from bipe_jax import data as data_lib
from bipe_jax.data import pile
from bipe_jax.data import tfds_builders
from bipe_jax.data import token_count
from configs import base
from configs import paper_151m
from tests import fixtures
from tests import forkserver

ROOT = fixtures.ROOT


def expected_texts(files: dict, split_files, subsets) -> list[str]:
  """The texts the reader must yield: every record of those files in a selected subset (a
  record without meta only when nothing is selected)."""
  return [r['text'] for rel in split_files for r in files[rel]
          if not subsets or r.get('meta', {}).get('pile_set_name') in subsets]


def pile_config(tmp_path, pile_dir, **fields):
  c = base.data_defaults()
  c.dataset, c.pile_dir, c.data_dir = 'pile', str(pile_dir), str(tmp_path / 'data')
  c.tokenizer_vocab_size, c.seq_len, c.num_threads, c.shuffle_window = 300, 16, 0, 0
  for key, value in fields.items():
    c[key] = value
  return c


def test_subset_names_aliases_and_errors():
  assert pile.parse_subsets('') == ()
  assert pile.parse_subsets('pg19, ArXiv,github') == ('ArXiv', 'Github', 'Gutenberg (PG-19)')
  assert pile.parse_subsets('PG19') == ('Gutenberg (PG-19)',)
  with pytest.raises(ValueError, match=r"data.pile_subsets='ArXiv,PG-19': 'PG-19' is not"):
    pile.parse_subsets('ArXiv,PG-19')
  assert pile.parse_splits('train,val') == ('train', 'validation')
  assert pile.parse_splits('validation,test,val') == ('validation', 'test')
  with pytest.raises(ValueError, match="'dev' is not one of"):
    pile.parse_splits('train,dev')
  with pytest.raises(ValueError, match='names no split'):
    pile.parse_splits(' , ')


@pytest.mark.parametrize('rel,split', [
    ('train/00.jsonl.zst', 'train'), ('val.jsonl.zst', 'validation'), ('test.jsonl', 'test'),
    ('validation/a.jsonl', 'validation'), ('train_07.jsonl', 'train'), ('Val.jsonl', 'validation'),
    ('pile/train/sub/x.jsonl', 'train'), ('train/00.json', None), ('README.md', None),
    ('other.jsonl', None), ('train.jsonl.gz', None)])
def test_split_of_path(rel, split):
  assert pile.split_of_path(rel) == split


def test_reader_selects_subsets_and_counts_skipped_lines(tmp_path):
  files = fixtures.make_pile_folder(tmp_path / 'pile')
  found = pile.split_files(str(tmp_path / 'pile'), ('train', 'validation', 'test'))
  assert found == {'train': ['train/00.jsonl.zst', 'train/01.jsonl'],
                   'validation': ['val.jsonl.zst'], 'test': ['test.jsonl']}
  for subsets in ((), ('ArXiv',), ('Github', 'Gutenberg (PG-19)')):
    report = pile.PileReport()
    docs = list(pile.iter_documents(str(tmp_path / 'pile'), found['train'], 'train', subsets,
                                    'text', report))
    assert [t for _, t in docs] == expected_texts(files, found['train'], subsets)
    assert len({i for i, _ in docs}) == len(docs)
    # the first record of the zst file is line 1; the plain file's ids count the skipped lines
    assert docs[0][0] == 'train/00.jsonl.zst:1' or subsets
    assert report.bad_json_lines == len(fixtures.BAD_LINES)
    if subsets:  # the record without meta cannot be selected: counted, not kept
      assert report.missing_subset == 1
      assert report.other_subsets == 2 * 24 - len(docs)
    else:
      assert report.missing_subset == 0 and len(docs) == 2 * 24 + 1
    assert report.documents['train'] == len(docs)
    assert sum(report.subset_documents.values()) == len(docs)
  assert report.as_dict()['subset_documents'] == {'train/Github': 12,
                                                  'train/Gutenberg (PG-19)': 12}


def test_errors_name_the_folder(tmp_path):
  with pytest.raises(ValueError, match='data.pile_dir is empty'):
    pile.list_files('')
  with pytest.raises(ValueError, match='is not a directory'):
    pile.list_files(str(tmp_path / 'missing'))
  fixtures.write_file(str(tmp_path / 'p' / 'train' / '00.jsonl'),
                      [json.dumps(fixtures.make_records(0, 1)[0])])
  with pytest.raises(ValueError, match=r"has no .jsonl / .jsonl.zst file for split\(s\) "
                                       r"\['validation'\]"):
    pile.split_files(str(tmp_path / 'p'), ('train', 'validation'))


def test_built_dataset_trains_and_evaluates_per_subset(tmp_path):
  """Built as TFDS array_record: the splits hold exactly the selected records (as a set: TFDS
  orders examples by key hash), training rows come out, and each evaluation subset is its own
  dataset of the validation file."""
  files = fixtures.make_pile_folder(tmp_path / 'pile')
  train_cfg = pile_config(tmp_path, tmp_path / 'pile')
  prepared = data_lib.prepare(train_cfg)
  assert prepared.built and prepared.trained_tokenizer
  for split, rels in (('train', ['train/00.jsonl.zst', 'train/01.jsonl']),
                      ('validation', ['val.jsonl.zst'])):
    texts = sorted(data_lib.preparation.iter_split_texts(train_cfg, split))
    assert texts == sorted(expected_texts(files, rels, ()))
  with pytest.raises(ValueError, match="split 'test' does not exist"):
    tfds_builders.open_split(train_cfg, 'test')
  report = tfds_builders.read_report(train_cfg)
  assert report['documents'] == {'train': 49, 'validation': 12}
  assert report['bad_json_lines'] == len(fixtures.BAD_LINES)
  for split in ('train', 'validation'):  # counted on 2 threads = the stream's length
    assert token_count.count_tokens(train_cfg, split, 2, batch_documents=5) == len(
        data_lib.eval_stream(train_cfg, split))
  batch = next(data_lib.make_train_iterator(train_cfg, 2))
  assert batch['tokens'].shape == (2, 16) and batch['tokens'].dtype == np.int32
  assert data_lib.prepare(train_cfg).built is False  # idempotent

  tokenizer = data_lib.get_tokenizer(train_cfg)
  for alias, name in pile.EVAL_SUBSETS.items():
    eval_cfg = pile_config(tmp_path, tmp_path / 'pile', pile_subsets=alias,
                           pile_splits='validation', tokenizer_path=tokenizer.path)
    data_lib.prepare(eval_cfg)
    texts = list(data_lib.preparation.iter_split_texts(eval_cfg, 'validation'))
    want = [r['text'] for r in files['val.jsonl.zst'] if r['meta']['pile_set_name'] == name]
    assert sorted(texts) == sorted(want)
    # the evaluation stream: each stored document as BOS + ids, concatenated
    stream = data_lib.eval_stream(eval_cfg, 'validation')
    assert np.array_equal(stream, np.concatenate([tokenizer.encode_document(t) for t in texts]))
    tokens, mask = data_lib.make_eval_blocks(eval_cfg, 16)
    assert tokens.shape[1] == 16 and tokens.shape[0] == len(stream) // 16 and mask.shape == tokens.shape
  assert sorted(os.listdir(tmp_path / 'data' / 'bipe_pile'))[0].startswith('ArXiv_val_')


def test_a_changed_file_is_a_new_dataset(tmp_path):
  fixtures.make_pile_folder(tmp_path / 'pile', n_train=4, n_val=4)
  cfg = pile_config(tmp_path, tmp_path / 'pile')
  first = tfds_builders.dataset_root(cfg)
  fixtures.write_file(str(tmp_path / 'pile' / 'val.jsonl.zst'),
                      [json.dumps(r) for r in fixtures.make_records(9, 5)])
  assert tfds_builders.dataset_root(cfg) != first
  assert tfds_builders.dataset_root(pile_config(tmp_path, tmp_path / 'pile',
                                                pile_subsets='arxiv')) != tfds_builders.dataset_root(cfg)


def test_paper_presets_read_the_pile():
  for name in ('bipe_rope', 'rope_llama'):
    config = paper_151m.get_config(name)
    assert config.data.dataset == 'pile' and config.data.seq_len == 1024
  llama = paper_151m.get_config('bipe_rope_llama')
  assert llama.model.separators == 'official' and llama.data.tokenizer_vocab_size == 32000
  with pytest.raises(ValueError, match='bipe_rope_llam is not a preset'):
    paper_151m.get_config('bipe_rope_llam')


@pytest.mark.slow
def test_paper_preset_shrunk_by_flags_trains_3_steps_on_a_pile_folder(tmp_path):
  fixtures.make_pile_folder(tmp_path / 'pile')
  workdir = tmp_path / 'run'
  flags = [f'--config.data.pile_dir={tmp_path / "pile"}',
           f'--config.data.data_dir={tmp_path / "data"}', *fixtures.PAPER_SHRUNK]
  proc = forkserver.run(
      [sys.executable, 'train/main.py', '--config=configs/paper_151m.py:bipe_rope',
       f'--workdir={workdir}', *flags],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT})
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = [json.loads(line) for line in open(workdir / 'metrics.jsonl')]
  steps = [r['step'] for r in records if 'loss' in r]
  assert steps[-1] == 3 and all(np.isfinite(r['loss']) for r in records if 'loss' in r)
  saved = json.load(open(workdir / 'config.json'))
  assert saved['data']['dataset'] == 'pile'


@pytest.mark.slow
def test_build_data_takes_a_presets_data_section(tmp_path):
  """train/build_data.py --config=<paper preset>: the Pile from the preset, flags on top; an
  evaluation subset built alone (its validation split only) and counted."""
  files = fixtures.make_pile_folder(tmp_path / 'pile')
  # an evaluation set alone: nothing to train a tokenizer on, none trained
  eval_only = data_lib.prepare(pile_config(tmp_path, tmp_path / 'pile', pile_subsets='arxiv',
                                           pile_splits='validation'))
  assert eval_only.built and eval_only.tokenizer_path == '' and not eval_only.trained_tokenizer
  tokenizer = data_lib.prepare(pile_config(tmp_path, tmp_path / 'pile')).tokenizer_path
  proc = forkserver.run(
      [sys.executable, 'train/build_data.py', '--config=configs/paper_151m.py:bipe_rope',
       f'--pile_dir={tmp_path / "pile"}', f'--data_dir={tmp_path / "data"}', '--vocab_size=300',
       '--pile_subsets=github', '--pile_splits=validation', f'--tokenizer_path={tokenizer}'],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT})
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.strip().splitlines()
  want = sum(r['meta']['pile_set_name'] == 'Github' for r in files['val.jsonl.zst'])
  assert lines[0].startswith('pile: built in ') and f'(0 train / {want} validation' in lines[0]
  assert lines[1] == f'tokenizer: {tokenizer} (existing, vocabulary 300, ' + lines[1].split(', ')[-1]
  cfg = pile_config(tmp_path, tmp_path / 'pile', pile_subsets='github', pile_splits='validation',
                    tokenizer_path=tokenizer)
  assert lines[2] == f'tokens: {len(data_lib.eval_stream(cfg, "validation")):,} validation'


def test_evaluation_scores_one_subsets_validation_split():
  """eval/perplexity.py --pile_subset: the run's data config narrowed to the subset's validation
  split, its tokenizer kept; a clear error for a run of another dataset."""
  from bipe_jax.evaluation import cli as eval_cli  # pylint: disable=g-import-not-at-top
  config = paper_151m.get_config('rope')
  config.data.pile_dir, config.data.tokenizer_path = '/data/pile', '/runs/r/tokenizer.model'
  run = types.SimpleNamespace(config=config)
  c = eval_cli.data_config_for(run, pile_subset='pg19')
  assert (c.dataset, c.pile_subsets, c.pile_splits) == ('pile', 'Gutenberg (PG-19)', 'validation')
  assert c.tokenizer_path == '/runs/r/tokenizer.model' and c.pile_dir == '/data/pile'
  assert config.data.pile_splits == 'train,validation'  # the run's config untouched
  with pytest.raises(ValueError, match="'PG-19' is not a Pile subset"):
    eval_cli.data_config_for(run, pile_subset='PG-19')
  config.data.dataset = 'embedded'
  with pytest.raises(ValueError, match='--pile_subset=arxiv needs data.dataset=pile'):
    eval_cli.data_config_for(run, pile_subset='arxiv')
