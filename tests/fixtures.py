"""Shared test fixtures: the subprocess environment, the tiny model config, and tiny trained runs
made once per test session.

- `cpu_env(devices)`: the environment of a subprocess that runs JAX on `devices` fake CPU devices
  with the suite's settings kept (fast compiles, the shared compilation cache: conftest.py).
- `tiny_model_config(**overrides)`: the one tiny model (`bipe_jax.config.ModelConfig`) of the
  in-process tests: 2 layers, width 32, 4 heads, FFN 64.
- `dirs`: a directory shared by all pytest-xdist workers of a session (a small text corpus, its
  prepared data and tokenizer), `cli_args` / `run_cli`: `train/main.py` on it with a tiny model.
- `trained_run`, `trained_rope_run`: a finished 4-step run (checkpoints 2 and 4) of bipe_rope /
  rope on that data, trained ONCE per session under a file lock (the first worker to ask trains,
  the others wait and read). Tests that only read a trained run (evaluation, restore, init_from,
  conversion, tokenizer pinning, position statistics) use these; a test that changes the run
  copies it first (`copy_run`).
- `make_pile_folder(root)`: a small folder in the Pile's format, `PAPER_SHRUNK`: the flags that
  shrink configs/paper_151m.py to a 3-step tiny run (tests/data/test_data_pile.py,
  tests/runs/test_gcs_end_to_end.py).
"""

import contextlib
import fcntl
import json
import os
import shutil
import sys

import numpy as np
import pytest

from tests import forkserver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(ROOT, 'train', 'main.py')
# Flags that make XLA's CPU compiles fast without changing what is computed (conftest.py says
# why the suite compiles at level 0; the legacy elemental emitters compile a fusion ~2x faster
# than the MLIR fusion emitters; one LLVM module per program instead of XLA's split into parts
# compiled on parallel threads, which costs ~27% more CPU in all on this 2-core machine): each
# is added unless XLA_FLAGS already sets it.
FAST_COMPILE_FLAGS = ('--xla_backend_optimization_level=0', '--xla_cpu_use_fusion_emitters=false',
                      '--xla_cpu_parallel_codegen_split_count=1')
DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'
CLI_STEPS = 120  # train.steps of cli_args (the training_e2e baseline's length)
CLI_EVERY = 30  # checkpoint interval of cli_args
WORDS = ('the a model token segment position sentence encoding length train test data value '
         'code line word').split()
SHORT = ('--config.train.steps=4', '--config.checkpoint.every_steps=2',
         '--config.checkpoint.async_save=False')  # the shared trained runs: checkpoints 2 and 4


def with_fast_compile(flags: list) -> list:
  """`flags` (XLA_FLAGS, split) with each of FAST_COMPILE_FLAGS it does not set appended."""
  names = {f.split('=', 1)[0] for f in flags}
  return [*flags, *(f for f in FAST_COMPILE_FLAGS if f.split('=', 1)[0] not in names)]


def xla_flags(devices: int = 1, environ=None) -> str:
  """XLA_FLAGS of `environ` (default os.environ) for `devices` fake CPU devices: the fast-compile
  flags and other flags kept, any device count replaced."""
  environ = os.environ if environ is None else environ
  flags = with_fast_compile(
      [f for f in environ.get('XLA_FLAGS', '').split() if not f.startswith(DEVICE_COUNT_FLAG)])
  if devices != 1:
    flags.append(f'{DEVICE_COUNT_FLAG}={devices}')
  return ' '.join(flags)


def cpu_env(devices: int = 1, **extra) -> dict:
  """os.environ for a JAX subprocess on `devices` fake CPU devices (repository on PYTHONPATH),
  updated with `extra`."""
  env = dict(os.environ)
  env.update(JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags(devices),
             PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))
  env.update(extra)
  return env


def tiny_model_config(**overrides):
  """The suite's tiny ModelConfig (2 layers, width 32, 4 heads, FFN 64, vocab 64, bipe_rope on
  separator id 3), with `overrides` (ModelConfig fields)."""
  from bipe_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  fields = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
                position_encoding='bipe_rope', separators='ids', separator_ids=(3,), max_intra=32,
                max_position=64, block_size=16)
  fields.update(overrides)
  return config_lib.model_config_from_dict(fields)


@contextlib.contextmanager
def file_lock(path):
  """An exclusive lock on `path` (fcntl) for the `with` body: one process at a time."""
  with open(path, 'w', encoding='utf-8') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def write_text_folder(path):
  rng = np.random.default_rng(0)
  os.makedirs(path, exist_ok=True)
  for d in range(60):
    lines = []
    for _ in range(rng.integers(5, 20)):
      sentence = ' '.join(rng.choice(WORDS, rng.integers(3, 10)))
      lines.append(sentence.capitalize() + str(rng.choice(['.', '!', '?', ','])))
    with open(os.path.join(path, f'doc{d:03d}.txt'), 'w', encoding='utf-8') as f:
      f.write('\n'.join(lines) + '\n')


# A folder in the Pile's format (bipe_jax/data/pile.py) whose records the tests know.
PILE_SUBSETS = ('ArXiv', 'Github', 'Gutenberg (PG-19)', 'Pile-CC')
PILE_WORDS = ('the model reads a long book . then it writes code\nand proofs ! why ? because '
              'segments matter . ').split(' ')


def _pile_text(rng, n_words: int) -> str:
  return ' '.join(rng.choice(PILE_WORDS, n_words))


def make_records(seed: int, n: int) -> list[dict]:
  """n Pile records cycling through PILE_SUBSETS, with texts of 20-80 words."""
  rng = np.random.default_rng(seed)
  return [{'text': f'doc {seed}-{i}: ' + _pile_text(rng, int(rng.integers(20, 80))),
           'meta': {'pile_set_name': PILE_SUBSETS[i % len(PILE_SUBSETS)]}} for i in range(n)]


# Lines the reader must skip, each counted once: not JSON, JSON without a text, a non-object,
# and (only under a subset selection) a record without meta.pile_set_name.
BAD_LINES = ['{not json', json.dumps({'meta': {'pile_set_name': 'ArXiv'}}), json.dumps([1, 2])]
NO_META = {'text': 'a record without meta'}


def write_file(path, lines: list[str]) -> None:
  """`lines` joined into the local file `path` (zstd-compressed for a .zst name)."""
  data = ('\n'.join(lines) + '\n').encode()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if str(path).endswith('.zst'):
    import zstandard  # pylint: disable=g-import-not-at-top (only the Pile tests)
    data = zstandard.ZstdCompressor(level=3).compress(data)
  with open(path, 'wb') as f:
    f.write(data)


def make_pile_folder(root, n_train: int = 24, n_val: int = 12) -> dict:
  """Writes a local Pile-format folder (train/00.jsonl.zst, train/01.jsonl, val.jsonl.zst,
  test.jsonl, README.md, .hidden/val.jsonl); returns {relative path: records} of its data files
  (the valid records, NO_META included; the bad lines are not records)."""
  files = {'train/00.jsonl.zst': make_records(0, n_train),
           'train/01.jsonl': make_records(1, n_train),
           'val.jsonl.zst': make_records(2, n_val),
           'test.jsonl': make_records(3, n_val)}
  files['train/01.jsonl'].insert(3, NO_META)
  for rel, records in files.items():
    lines = [json.dumps(r) for r in records]
    if rel == 'train/01.jsonl':  # the skipped kinds of line, and an empty one, in the middle
      lines[3:3] = BAD_LINES + ['']
    write_file(os.path.join(root, rel), lines)
  write_file(os.path.join(root, 'README.md'), ['not data'])
  write_file(os.path.join(root, '.hidden', 'val.jsonl'), [json.dumps(NO_META)])
  return files


# configs/paper_151m.py:bipe_rope shrunk by flags to a 1-layer width-32 model, rows of 32 tokens,
# a 300-piece tokenizer, batch 2, 3 steps, checkpoint 3 saved synchronously (add the data flags:
# data.pile_dir, data.data_dir).
PAPER_SHRUNK = tuple(f'--config.{flag}' for flag in (
    'data.tokenizer_vocab_size=300', 'model.vocab_size=300', 'model.hidden_size=32',
    'model.num_layers=1', 'model.num_heads=2', 'model.ffn_size=64', 'model.max_intra=32',
    'model.max_position=32', 'model.block_size=32', 'data.seq_len=32', 'train.batch_size=2',
    'train.steps=3', 'train.warmup_steps=1', 'train.log_every=1', 'checkpoint.every_steps=3',
    'checkpoint.async_save=false', 'data.num_threads=1', 'data.shuffle_window=8'))


def session_dir(tmp_path_factory, name):
  """tmp/<name>, shared by the pytest-xdist workers of this session (their base temp's parent).

  Grouping with xdist_group is not relied on: pytest 9.2 + xdist 3.8 ignore it (xdist #1386).
  """
  root = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    root = root.parent
  path = root / name
  path.mkdir(exist_ok=True)
  return path


@pytest.fixture(scope='session')
def dirs(tmp_path_factory):
  """The session's shared directory: text/ (a small generated corpus), data/ (prepared by the
  first run), the trained runs below."""
  base = session_dir(tmp_path_factory, 'training_e2e_shared')
  with file_lock(str(base / '.lock')):
    if not (base / 'text').is_dir():
      write_text_folder(str(base / 'tmp_text'))
      os.rename(base / 'tmp_text', base / 'text')
  return base


def cli_args(dirs, workdir, *extra):  # pylint: disable=redefined-outer-name
  """`python train/main.py` with the tiny model on the shared text data; `extra` flags last.

  Rows are mixed in windows of 8 (data.shuffle_window): the default window of 4,096 rows is
  tokenised before the first step, about a second of CPU in every run of a few steps."""
  return [sys.executable, MAIN, '--config=configs/tiny.py', f'--workdir={workdir}',
          '--config.model.vocab_size=320', '--config.model.hidden_size=32',
          '--config.model.num_layers=1', '--config.model.num_heads=4',
          '--config.model.ffn_size=64', '--config.model.max_intra=32',
          '--config.model.max_position=32', '--config.model.block_size=16',
          '--config.data.seq_len=32', '--config.data.dataset=text_folder',
          f'--config.data.text_dir={dirs / "text"}', f'--config.data.data_dir={dirs / "data"}',
          '--config.data.tokenizer_vocab_size=320', '--config.train.batch_size=8',
          f'--config.train.steps={CLI_STEPS}', '--config.train.schedule=constant',
          '--config.train.warmup_steps=2', '--config.train.log_every=1',
          f'--config.checkpoint.every_steps={CLI_EVERY}', '--config.train.data_shards=2',
          '--config.data.shuffle_window=8', *extra]


def cli_env(dirs=None, devices=1):  # pylint: disable=redefined-outer-name,unused-argument
  """The environment of a `train/main.py` subprocess (cpu_env; `dirs` is accepted for the
  callers that pass it)."""
  return cpu_env(devices)


def run_cli(dirs, workdir, *extra, devices=1, expect=0):  # pylint: disable=redefined-outer-name
  proc = forkserver.run(cli_args(dirs, workdir, *extra), cwd=ROOT, env=cli_env(dirs, devices),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


def checkpoint_steps(workdir) -> list:
  path = os.path.join(workdir, 'checkpoints')
  return sorted(int(n) for n in os.listdir(path) if n.isdigit())


def trained_once(dirs, name, *extra):  # pylint: disable=redefined-outer-name
  """dirs/<name>: `run_cli(*extra)` made once per session (under a lock, marked DONE)."""
  workdir = str(dirs / name)
  with file_lock(str(dirs / f'.{name}.lock')):
    if not os.path.exists(os.path.join(workdir, 'DONE')):
      shutil.rmtree(workdir, ignore_errors=True)
      run_cli(dirs, workdir, *extra)
      open(os.path.join(workdir, 'DONE'), 'w', encoding='utf-8').close()
  return workdir


def copy_run(src, tmp_path, name='copy'):
  """A copy of the run `src` (without the session's DONE mark) to change freely."""
  dst = str(tmp_path / name)
  shutil.copytree(src, dst, ignore=shutil.ignore_patterns('DONE'))
  return dst


def cut_array_files(step_dir: str) -> int:
  """Cuts every array data file of an Orbax checkpoint item (the files of its OCDBT `d/`
  folders) to 10 bytes; their number. Every array, parameters and optimizer state alike, then
  fails to read: which arrays share a file varies from run to run, so cutting one file would
  leave a parameters-only restore (evaluation) intact in some runs."""
  cut = 0
  for folder, _, files in os.walk(step_dir):
    if os.path.basename(folder) != 'd':
      continue
    for name in files:
      with open(os.path.join(folder, name), 'r+b') as f:
        f.truncate(10)
      cut += 1
  return cut


@pytest.fixture(scope='session')
def trained_run(dirs):  # pylint: disable=redefined-outer-name
  """A finished 4-step bipe_rope run (checkpoints 2 and 4) on the shared data. Read only."""
  workdir = trained_once(dirs, 'trained_bipe_rope', *SHORT)
  assert checkpoint_steps(workdir) == [2, 4]
  return workdir


@pytest.fixture(scope='session')
def trained_rope_run(dirs):  # pylint: disable=redefined-outer-name
  """A finished 4-step rope run (exportable to a Hugging Face Llama folder). Read only."""
  workdir = trained_once(dirs, 'trained_rope', *SHORT, '--config.model.position_encoding=rope')
  assert checkpoint_steps(workdir) == [2, 4]
  return workdir
