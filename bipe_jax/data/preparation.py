"""`prepare` (build what is missing) and `get_tokenizer` (load the configured tokenizer).

The default tokenizer of a dataset lives beside it: `<dataset root>/spm_<type>_<vocab>.model`
(see tfds_builders.dataset_root). `data.tokenizer_path` overrides it (any SentencePiece model,
e.g. the Llama tokenizer). Generated datasets (e.g. the arithmetic task) are delegated to the
hooks their task registered (`generated`). Jobs that share a data_dir prepare it one at a time
(`preparation_lock`), so two runs started together build it once.
"""

import contextlib
import dataclasses
import fcntl
import logging
import os
import time

from bipe_jax import storage
from bipe_jax.data import generated
from bipe_jax.data import pile
from bipe_jax.data import tfds_builders
from bipe_jax.data import tokenizer as tokenizer_lib


def default_tokenizer_path(data_config) -> str:
  model_type = data_config.tokenizer_model_type
  return os.path.join(tfds_builders.dataset_root(data_config),
                      f'spm_{model_type}_{int(data_config.tokenizer_vocab_size)}.model')


def tokenizer_path(data_config) -> str:
  if data_config.tokenizer_path:
    return storage.absolute(data_config.tokenizer_path)
  return default_tokenizer_path(data_config)


def separator_rule(model, data_config) -> str:
  """The rule a run's separator ids come from: model.separators, with 'auto' resolved for the
  run's dataset (`default_separator_rule`; left 'auto' when the dataset cannot be inspected)."""
  rule = model.get('separators', 'ids')
  if rule == 'auto' and data_config is not None:
    try:
      rule = default_separator_rule(data_config)
    except (OSError, ValueError, AttributeError):
      pass
  return rule


def default_separator_rule(data_config) -> str:
  """The separator rule that fits the dataset's kind (what `model.separators='auto'` means).

  'newline' for a text folder whose files are all source code (the paper segments code at
  newlines only); 'sentence' (full stop, '!', '?', newline) for everything else, including the
  embedded corpus, whose prose (the CPython docs) and code (the standard library) share the
  newline and whose code rarely holds a sentence-final piece.
  """
  if data_config.dataset == 'text_folder' and data_config.text_dir:
    from bipe_jax.data import text_folder  # pylint: disable=g-import-not-at-top
    exts = {os.path.splitext(rel)[1].lower()
            for rel, _, _ in storage.walk_files(storage.absolute(data_config.text_dir))}
    exts.discard('')
    if exts and exts <= set(text_folder.CODE_EXTENSIONS):
      return 'newline'
  return 'sentence'


def get_tokenizer(data_config):
  """The configured tokenizer (a `Tokenizer`); a clear error when it does not exist yet."""
  task = generated.lookup(data_config.dataset)
  if task is not None:
    return task.get_tokenizer(data_config)
  path = tokenizer_path(data_config)
  if not storage.isfile(path):
    if data_config.tokenizer_path:
      raise ValueError(f'data.tokenizer_path={data_config.tokenizer_path!r} does not exist')
    raise ValueError(f'no tokenizer at {path}: call bipe_jax.data.prepare(config.data) or run '
                     f'`python train/build_data.py --dataset={data_config.dataset} '
                     f'--data_dir={data_config.data_dir}` first')
  return tokenizer_lib.Tokenizer(path)


def iter_split_texts(data_config, split: str = 'train'):
  """Document texts of one split in stored order (decoded from the array_record files)."""
  source, feature = tfds_builders.open_split(data_config, split)
  for i in range(len(source)):
    text = source[i][feature]
    yield text.decode('utf-8', 'replace') if isinstance(text, bytes) else str(text)


@dataclasses.dataclass
class Prepared:
  version_dir: str
  tokenizer_path: str
  seconds: float
  built: bool
  trained_tokenizer: bool


def prepare(data_config, *, force: bool = False, max_tokenizer_characters: int = 50_000_000):
  """Builds the dataset (embedded / text folder) and trains its tokenizer when missing.

  Idempotent and fast when everything exists. Catalog datasets (pg19, arxiv) must already be
  prepared in data_dir (clear error otherwise); their tokenizer is trained here if missing,
  on the first `max_tokenizer_characters` of the train split.
  """
  start = time.perf_counter()
  task = generated.lookup(data_config.dataset)
  if task is not None:
    if task.prepare is not None:
      task.prepare(data_config)
    return Prepared('', '', time.perf_counter() - start, False, False)
  with preparation_lock(data_config):
    return _prepare_locked(data_config, start, force, max_tokenizer_characters)


LOCK_FILE = '.bipe_jax_prepare.lock'


@contextlib.contextmanager
def preparation_lock(data_config):
  """Holds an exclusive lock on `data.data_dir` for the time of a preparation.

  Two jobs that share a data_dir (two training runs started together, a run beside
  `train/build_data.py`) would otherwise both build the dataset and its tokenizer into the same
  directories, and the second rename of TFDS's `incomplete.*` directory fails. With the lock the
  second waits and then finds the first one's result. An advisory `flock` on
  `<data_dir>/.bipe_jax_prepare.lock`: it holds between processes on one machine (and between
  threads, each opening the file itself). Not locked: a remote data_dir (`gs://...`) and a
  read-only one (a shared, already prepared catalog dataset), where nothing is built.
  """
  if not storage.is_local(data_config.data_dir):
    yield
    return
  data_dir = os.path.abspath(os.path.expanduser(data_config.data_dir))
  before = local_paths(data_dir)  # what a failed preparation must leave (the lock file is new)
  try:
    os.makedirs(data_dir, exist_ok=True)
    f = open(os.path.join(data_dir, LOCK_FILE), 'a', encoding='utf-8')  # pylint: disable=consider-using-with
  except OSError as e:
    logging.info('preparing without a lock: %s', e)
    yield
    return
  with f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    except BaseException:
      remove_new_paths(data_dir, before)
      raise
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def local_paths(folder: str):
  """Every path under the local `folder` (itself included), or None when it does not exist."""
  if not os.path.isdir(folder):
    return None
  found = {folder}
  for parent, dirs, files in os.walk(folder):
    found.update(os.path.join(parent, name) for name in dirs + files)
  return found


def remove_new_paths(folder: str, before) -> None:
  """After a failed preparation: removes what it created under `folder` (every path not in
  `before`, from `local_paths`; the whole folder when it did not exist), never what was there."""
  after = local_paths(folder)
  if after is None:
    return
  kept = before or set()
  for path in sorted(after - kept):  # parents sort before their contents
    if os.path.dirname(path) in kept or path == folder:
      try:
        storage.remove(path)
      except FileNotFoundError:
        pass
      except OSError as e:
        logging.info('could not remove %s after a failed preparation: %s', path, e)


def evaluation_only(data_config) -> bool:
  """A Pile dataset built without a train split (an evaluation subset): no tokenizer of its
  own; it is tokenised with the evaluated run's."""
  return (data_config.dataset == 'pile'
          and 'train' not in pile.parse_splits(data_config.pile_splits))


def _prepare_locked(data_config, start: float, force: bool, max_tokenizer_characters: int):
  existed = tfds_builders._prepared_version_dir(tfds_builders.dataset_root(data_config))  # pylint: disable=protected-access
  vdir = tfds_builders.build(data_config, force=force)
  built = force or existed is None
  path = tokenizer_path(data_config)
  trained = False
  if data_config.tokenizer_path:
    if not storage.isfile(path):
      raise ValueError(f'data.tokenizer_path={data_config.tokenizer_path!r} does not exist '
                       '(leave it empty to train a tokenizer beside the data)')
  elif evaluation_only(data_config):
    path = ''  # nothing to train a tokenizer on
  elif force or built or not storage.isfile(path):
    t = time.perf_counter()
    tokenizer_lib.train_tokenizer(
        iter_split_texts(data_config, 'train'), path,
        model_type=data_config.tokenizer_model_type,
        vocab_size=int(data_config.tokenizer_vocab_size),
        max_characters=max_tokenizer_characters)
    trained = True
    logging.info('trained %s in %.1fs', path, time.perf_counter() - t)
  return Prepared(vdir, path, time.perf_counter() - start, built, trained)
