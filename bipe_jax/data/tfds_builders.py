"""TFDS datasets stored as array_record: the embedded corpus, a text folder, pg19 and arXiv.

Building and reading need no TensorFlow: `GeneratorBasedBuilder` writes array_record files
with TFDS's own example serialisation, and `tfds.builder_from_directory(...).as_data_source()`
reads them back with random access (what grain needs). Catalog datasets (`pg19`,
`scientific_papers/arxiv`) are never downloaded here: they are read from the user's `data_dir`
when prepared there with `tfds build ... --file_format=array_record`, and a clear error says how
to prepare them otherwise.

On-disk layout (`data_dir` = config.data.data_dir):
  bipe_embedded/<py311_val050>/1.0.0/...      the embedded corpus (per Python version, split)
  bipe_text_folder/<name>_<fingerprint>/1.0.0/...   a folder of text
  bipe_pile/<subsets>_<splits>_<fingerprint>/1.0.0/...   a Pile-format folder (data/pile.py)
  pg19/<version>/...,  scientific_papers/arxiv/<version>/...   prepared by the user
Each dataset's root (the folder above the version) also holds its tokenizers and
`build_report.json`.
"""

import contextlib
import inspect
import io
import json
import logging
import os
import re

from etils import epath
import tensorflow_datasets as tfds

from bipe_jax import storage
from bipe_jax.data import documents
from bipe_jax.data import embedded_corpus
from bipe_jax.data import pile
from bipe_jax.data import text_folder

VERSION = '1.0.0'
DATASETS = ('embedded', 'text_folder', 'pile', 'pg19', 'arxiv')
# TFDS catalog name and the feature that holds the document text.
CATALOG = {'pg19': ('pg19', 'book_text'), 'arxiv': ('scientific_papers/arxiv', 'article')}
TEXT_FEATURE = 'text'
REPORT_FILE = 'build_report.json'


def _features():
  return tfds.features.FeaturesDict({'text': tfds.features.Text(), 'id': tfds.features.Text()})


class _DocumentBuilderMixin:
  """Shared generation: documents -> split by document -> examples keyed by document id."""

  # TFDS locates a builder's source through importlib resources, which fails for editable
  # installs without the `importlib_resources` backport; this file is the source.
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return epath.Path(inspect.getfile(cls))

  def _documents(self, report):
    raise NotImplementedError

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing is downloaded
    self.report = documents.BuildReport()
    splits = documents.assign_splits(self._documents(self.report), self._validation_fraction,
                                     self.report)
    return {name: self._generate_examples(items) for name, items in splits.items()}

  def _generate_examples(self, items):
    for doc_id, text in items:
      yield doc_id, {'text': text, 'id': doc_id}


class BipeEmbedded(_DocumentBuilderMixin, tfds.core.GeneratorBasedBuilder):
  """Python reference topics (prose) and standard-library modules (code), split by document."""
  VERSION = tfds.core.Version(VERSION)

  def __init__(self, *, validation_fraction: float = 0.05, **kwargs):
    self._validation_fraction = validation_fraction
    super().__init__(**kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, features=_features(),
        description=('Embedded default corpus: CPython pydoc_data.topics (prose) and standard '
                     f'library .py files (code), Python {embedded_corpus.version_tag()}.'))

  def _documents(self, report):
    return embedded_corpus.iter_documents(report)


class BipeTextFolder(_DocumentBuilderMixin, tfds.core.GeneratorBasedBuilder):
  """A local folder of .txt / .jsonl / source-code files, split by document."""
  VERSION = tfds.core.Version(VERSION)

  def __init__(self, *, text_dir: str, text_field: str = 'text',
               validation_fraction: float = 0.05, **kwargs):
    self._text_dir = text_dir
    self._text_field = text_field
    self._validation_fraction = validation_fraction
    super().__init__(**kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=_features(),
                                 description=f'Text folder {storage.absolute(self._text_dir)}')

  def _documents(self, report):
    return text_folder.iter_documents(self._text_dir, self._text_field, report)


class BipePile(_DocumentBuilderMixin, tfds.core.GeneratorBasedBuilder):
  """A folder in the Pile's format (jsonl / jsonl.zst): its splits by file (not by document
  hash), records selected by `meta.pile_set_name` (bipe_jax/data/pile.py)."""
  VERSION = tfds.core.Version(VERSION)

  def __init__(self, *, pile_dir: str, subsets, splits, text_field: str = 'text', **kwargs):
    self._pile_dir, self._subsets, self._splits = pile_dir, tuple(subsets), tuple(splits)
    self._text_field = text_field
    super().__init__(**kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, features=_features(),
        description=(f'Pile-format folder {self._pile_dir}, subsets '
                     f'{list(self._subsets) or "all"}'))

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing is downloaded
    self.report = pile.PileReport()
    files = pile.split_files(self._pile_dir, self._splits)
    return {split: self._generate_examples(split, names) for split, names in files.items()}

  def _generate_examples(self, split, names):
    for doc_id, text in pile.iter_documents(self._pile_dir, names, split, self._subsets,
                                            self._text_field, self.report):
      yield doc_id, {'text': text, 'id': doc_id}


def _pile_selection(data_config):
  """(subsets, splits) of a dataset='pile' config."""
  return (pile.parse_subsets(data_config.get('pile_subsets', '')),
          pile.parse_splits(data_config.get('pile_splits', 'train,validation')))


def _config_name(data_config) -> str:
  if data_config.dataset == 'pile':
    return pile.config_name(data_config.pile_dir, *_pile_selection(data_config))
  frac = round(float(data_config.validation_fraction) * 1000)
  if data_config.dataset == 'embedded':
    return f'{embedded_corpus.version_tag()}_val{frac:03d}'
  base = os.path.basename(os.path.normpath(data_config.text_dir)) or 'root'
  base = ''.join(c if c.isalnum() or c in '-_' else '_' for c in base)
  fp = text_folder.fingerprint(data_config.text_dir, data_config.text_field,
                               data_config.validation_fraction)
  return f'{base}_{fp}'


def check_dataset_name(dataset: str) -> None:
  if dataset not in DATASETS:
    from bipe_jax.data import generated  # pylint: disable=g-import-not-at-top
    raise ValueError(f'data.dataset={dataset!r} is not one of {DATASETS + generated.names()}')


def dataset_root(data_config) -> str:
  """The folder above the dataset's version folder: its tokenizers and build report live here."""
  check_dataset_name(data_config.dataset)
  data_dir = storage.absolute(data_config.data_dir)
  if data_config.dataset == 'embedded':
    return os.path.join(data_dir, 'bipe_embedded', _config_name(data_config))
  if data_config.dataset == 'text_folder':
    return os.path.join(data_dir, 'bipe_text_folder', _config_name(data_config))
  if data_config.dataset == 'pile':
    return os.path.join(data_dir, 'bipe_pile', _config_name(data_config))
  return os.path.join(data_dir, *CATALOG[data_config.dataset][0].split('/'))


def _prepared_version_dir(root: str) -> str | None:
  """The highest version folder under `root` holding a dataset_info.json, or None."""
  found = []
  for info in (storage.glob(root, '*/dataset_info.json') if storage.isdir(root) else []):
    version = os.path.basename(os.path.dirname(info))
    try:
      found.append((tuple(int(p) for p in version.split('.')), os.path.dirname(info)))
    except ValueError:
      continue  # e.g. an `incomplete.XXXX` folder left by an interrupted build
  return max(found)[1] if found else None


def _prepare_hint(data_config) -> str:
  name = CATALOG[data_config.dataset][0]
  return (f'prepare it with `tfds build {name} --data_dir={data_config.data_dir} '
          '--file_format=array_record` (on a machine with TensorFlow and network access; copy '
          'the resulting folder here if needed). This library never downloads it.')


def version_dir(data_config) -> str:
  """The prepared version folder; a clear ValueError when the dataset is missing or unusable."""
  root = dataset_root(data_config)
  found = _prepared_version_dir(root)
  if found is None:
    if data_config.dataset in CATALOG:
      raise ValueError(f'dataset {data_config.dataset!r} is not prepared in '
                       f'data_dir={data_config.data_dir!r} (no {root}/<version>/'
                       f'dataset_info.json): {_prepare_hint(data_config)}')
    raise ValueError(f'dataset {data_config.dataset!r} is not built in data_dir='
                     f'{data_config.data_dir!r} (expected {root}/{VERSION}): call '
                     'bipe_jax.data.prepare(config.data) or run `python train/build_data.py '
                     f'--dataset={data_config.dataset} --data_dir={data_config.data_dir}`')
  if not storage.glob(found, '*.array_record-*'):
    hint = (_prepare_hint(data_config) if data_config.dataset in CATALOG
            else 'delete the folder and build it again')
    raise ValueError(f'dataset {data_config.dataset!r} in {found} has no array_record files '
                     f'(another file format?): {hint}')
  return found


def build(data_config, *, force: bool = False) -> str:
  """Builds the embedded corpus, a text folder or a Pile folder as array_record (idempotent);
  its version dir.

  Catalog datasets cannot be built here: they get the `version_dir` error when missing.
  """
  check_dataset_name(data_config.dataset)
  if data_config.dataset in CATALOG:
    return version_dir(data_config)
  root = dataset_root(data_config)
  existing = _prepared_version_dir(root)
  if existing and not force:
    return existing
  data_dir = storage.absolute(data_config.data_dir)
  if existing and force:
    storage.rmtree(existing)
  # array_record writes local files only: a gs:// data_dir is built in a local folder, then
  # copied (dataset_info.json last: what marks a version folder as complete)
  with storage.local_staging(data_dir) as build_dir:
    builder, printed = _build_in(data_config, build_dir, os.path.basename(root))
    built = str(builder.data_dir)
    if build_dir != data_dir:
      target = storage.join(data_dir, os.path.relpath(built, build_dir))
      storage.copy_tree(built, target, last=('dataset_info.json',))
      built = target
  for line in printed.splitlines():
    logging.info('tfds: %s', line)
  report = builder.report.as_dict()
  report['dataset'] = data_config.dataset
  storage.write_text_atomic(os.path.join(root, REPORT_FILE), json.dumps(report, indent=2))
  # The embedded corpus's report is known (a few empty __init__.py files): the log file only.
  note = logging.info if data_config.dataset == 'embedded' else logging.warning
  for line in builder.report.warnings():
    note('%s: %s', data_config.dataset, line)
  return built


def _build_in(data_config, data_dir: str, config_name: str):
  """(builder, what TFDS printed) after building the dataset as array_record in `data_dir`."""
  config = tfds.core.BuilderConfig(name=config_name)
  kwargs = dict(data_dir=data_dir, config=config, file_format='array_record',
                validation_fraction=float(data_config.validation_fraction))
  if data_config.dataset == 'embedded':
    builder = BipeEmbedded(**kwargs)
  elif data_config.dataset == 'pile':
    del kwargs['validation_fraction']  # the folder's own splits
    subsets, splits = _pile_selection(data_config)
    builder = BipePile(pile_dir=data_config.pile_dir, subsets=subsets, splits=splits,
                       text_field=data_config.text_field, **kwargs)
  else:
    builder = BipeTextFolder(text_dir=data_config.text_dir, text_field=data_config.text_field,
                             **kwargs)
  tfds.disable_progress_bar()
  # TFDS prints "Downloading and preparing dataset Unknown size ..." to stdout although nothing
  # is downloaded: the lines go to the INFO log (a run's log file), not to the terminal.
  printed = io.StringIO()
  try:
    with contextlib.redirect_stdout(printed):
      builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
          download_mode=tfds.GenerateMode.REUSE_DATASET_IF_EXISTS))
  except AssertionError as e:  # TFDS's "Failed to finalize writing of split ...: No examples"
    if 'No examples were yielded' not in str(e):
      raise
    raise ValueError(_no_documents_message(data_config, str(e))) from None
  return builder, printed.getvalue()


def _no_documents_message(data_config, error: str) -> str:
  """One line for a split that yielded no document (TFDS: 'No examples were yielded')."""
  split = re.search(r'split "([^"]+)"', error)
  where = f'split {split.group(1)!r}' if split else 'a split'
  if data_config.dataset == 'pile':
    subsets = data_config.pile_subsets or '(all)'
    return (f'data.pile_subsets={subsets!r}: {where} of data.pile_dir={data_config.pile_dir!r} '
            'holds no document of those subsets (each record names its subset in '
            'meta.pile_set_name); choose subsets the folder holds')
  source = data_config.text_dir if data_config.dataset == 'text_folder' else data_config.dataset
  return f'dataset {data_config.dataset!r} ({source}): {where} holds no document'


def read_report(data_config) -> dict:
  """The build report of a built embedded / text-folder dataset ({} for catalog datasets)."""
  return storage.read_json(
      os.path.join(os.path.dirname(version_dir(data_config)), REPORT_FILE)) or {}


def open_split(data_config, split: str):
  """(random-access source of examples, name of the text feature) for one split."""
  vdir = version_dir(data_config)
  builder = tfds.builder_from_directory(vdir)
  available = sorted(builder.info.splits.keys())
  if split not in available:
    raise ValueError(f'split {split!r} does not exist in dataset {data_config.dataset!r} '
                     f'({vdir}); available: {available}')
  feature = CATALOG[data_config.dataset][1] if data_config.dataset in CATALOG else TEXT_FEATURE
  return builder.as_data_source(split=split), feature
