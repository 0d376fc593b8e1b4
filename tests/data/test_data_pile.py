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
  # subsets the evaluation cannot score: one line each (a name that is no subset before any
  # checkpoint is read), and no traceback after it (no Orbax object left to the interpreter's
  # exit)
  # (real interpreters, not tests/forkserver.py's forks: what they print at exit counts too)
  import subprocess  # pylint: disable=g-import-not-at-top
  for subset, says, loaded in (('PG-19', "--pile_subset=PG-19: 'PG-19' is not a Pile subset", 0),
                               ('Books3', "dataset 'pile' is not built in ", 1)):
    proc = subprocess.run(
        [sys.executable, 'eval/perplexity.py', f'--workdir={workdir}', f'--pile_subset={subset}',
         '--lengths=32', '--output='],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=fixtures.cpu_env())
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert len(proc.stdout.splitlines()) == loaded, proc.stdout  # the run's line, once loaded
    assert proc.stderr.startswith(f'error: {says}') and proc.stderr.count('\n') == 1, proc.stderr
  # training on subsets the folder does not hold: one line, not TFDS's traceback
  proc = subprocess.run(
      [sys.executable, 'train/main.py', '--config=configs/paper_151m.py:bipe_rope',
       f'--workdir={tmp_path / "books"}', *flags, '--config.data.pile_subsets=Books3'],
      cwd=ROOT, capture_output=True, text=True, timeout=600, env=fixtures.cpu_env())
  assert proc.returncode == 2 and proc.stdout == '', proc.stdout + proc.stderr[-3000:]
  assert proc.stderr.startswith("config error: data.pile_subsets='Books3': split 'train' of "
                                'data.pile_dir=') and proc.stderr.count('\n') == 1, proc.stderr


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


def test_evaluation_flags_for_the_pile_are_checked_before_any_checkpoint():
  """--dataset=pile needs the Pile's folder (--pile_dir, or the run's data.pile_dir); the flag
  reaches the data config; a bad --pile_subset or a --pile_dir without the Pile names the flag."""
  from bipe_jax.evaluation import cli as eval_cli  # pylint: disable=g-import-not-at-top
  text_run = types.SimpleNamespace(config=base.get_base_config())
  text_run.config.data.tokenizer_path = '/runs/r/tokenizer.model'
  with pytest.raises(ValueError, match=r'^--dataset=pile: this run has no data.pile_dir; give '
                                       r'--pile_dir=FOLDER'):
    eval_cli.check_data_flags(text_run.config.data, dataset='pile')
  c = eval_cli.data_config_for(text_run, dataset='pile', pile_dir='/data/pile',
                               pile_subset='arxiv')
  assert (c.dataset, c.pile_dir, c.pile_subsets, c.pile_splits) == (
      'pile', '/data/pile', 'ArXiv', 'validation')
  assert c.tokenizer_path == '/runs/r/tokenizer.model'  # the run's own
  assert text_run.config.data.pile_dir == ''  # the run's config untouched
  with pytest.raises(ValueError, match=r'^--pile_dir=/data/pile needs data.dataset=pile'):
    eval_cli.check_data_flags(text_run.config.data, pile_dir='/data/pile')
  with pytest.raises(ValueError, match=r"^--pile_subset=PG-19: 'PG-19' is not a Pile subset"):
    eval_cli.check_data_flags(text_run.config.data, dataset='pile', pile_dir='/p',
                              pile_subset='PG-19')
  pile_run = paper_151m.get_config('rope').data
  pile_run.pile_dir = '/data/pile'
  eval_cli.check_data_flags(pile_run)  # the run's own folder: nothing to give


def test_perplexity_cli_takes_pile_dir(trained_run, tmp_path):
  """eval/perplexity.py --dataset=pile on a text run: without --pile_dir one line before any
  checkpoint is read; with it, the folder is the one the data config names (here: not built in
  the empty --data_dir, so the line names the dataset folder made from that Pile folder)."""
  from bipe_jax.evaluation import cli as eval_cli  # pylint: disable=g-import-not-at-top
  from bipe_jax.runs import restore as run_restore  # pylint: disable=g-import-not-at-top
  folder, data_dir = tmp_path / 'pile', tmp_path / 'data'
  fixtures.make_pile_folder(folder)
  command = [sys.executable, 'eval/perplexity.py', f'--workdir={trained_run}', '--lengths=32',
             '--output=', '--dataset=pile', f'--data_dir={data_dir}']
  proc = forkserver.run(command, cwd=ROOT, env=fixtures.cpu_env(), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 2 and proc.stdout == '', proc.stdout + proc.stderr[-2000:]
  assert proc.stderr.startswith('error: --dataset=pile: this run has no data.pile_dir; give '
                                '--pile_dir=') and proc.stderr.count('\n') == 1, proc.stderr
  proc = forkserver.run(command + [f'--pile_dir={folder}'], cwd=ROOT, env=fixtures.cpu_env(),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  wanted = eval_cli.data_config_for(
      types.SimpleNamespace(config=run_restore.read_config(trained_run)), dataset='pile',
      data_dir=str(data_dir), pile_dir=str(folder))
  root = tfds_builders.dataset_root(wanted)
  assert os.path.basename(os.path.dirname(root)) == 'bipe_pile'
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: dataset 'pile' is not built in ") and root in last, last
  assert 'Traceback' not in proc.stderr


def test_a_subset_the_folder_lacks_is_one_line_and_the_failed_build_leaves_nothing(tmp_path):
  """Selecting subsets no record of the folder names: one line (not TFDS's 'No examples were
  yielded' traceback). The failed build removes what it made in data_dir: the whole folder when
  it did not exist, only the new entries when it did (what was there stays)."""
  fixtures.make_pile_folder(tmp_path / 'pile')
  cfg = pile_config(tmp_path, tmp_path / 'pile', pile_subsets='Books3', pile_splits='validation')
  message = (r"^data.pile_subsets='Books3': split 'validation' of data.pile_dir='.*pile' holds "
             r'no document of those subsets')
  with pytest.raises(ValueError, match=message):
    data_lib.prepare(cfg)
  assert not os.path.exists(cfg.data_dir)
  os.makedirs(os.path.join(cfg.data_dir, 'bipe_pile', 'older'))
  kept = os.path.join(cfg.data_dir, 'bipe_pile', 'older', 'keep.txt')
  with open(kept, 'w', encoding='utf-8') as f:
    f.write('built before')
  with pytest.raises(ValueError, match=message):
    data_lib.prepare(cfg)
  found = sorted(os.path.relpath(os.path.join(d, n), cfg.data_dir)
                 for d, dirs, files in os.walk(cfg.data_dir) for n in dirs + files)
  assert found == ['bipe_pile', 'bipe_pile/older', 'bipe_pile/older/keep.txt'], found


def test_build_data_refused_leaves_no_data_dir(tmp_path):
  """train/build_data.py with a name that is no Pile subset: one line, and no data_dir left
  holding only the preparation's lock file."""
  fixtures.make_pile_folder(tmp_path / 'pile')
  data_dir = tmp_path / 'data'
  proc = forkserver.run(
      [sys.executable, 'train/build_data.py', '--dataset=pile', f'--pile_dir={tmp_path / "pile"}',
       f'--data_dir={data_dir}', '--pile_subsets=PG-19', '--pile_splits=validation'],
      cwd=ROOT, env=fixtures.cpu_env(), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2  # a bad command (bipe_jax.cli.EXIT_USER_ERROR)
  assert proc.stderr.startswith("error: data.pile_subsets='PG-19': 'PG-19' is not a Pile subset")
  assert proc.stderr.count('\n') == 1, proc.stderr
  assert not data_dir.exists()
