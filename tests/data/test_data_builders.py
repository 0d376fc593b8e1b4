"""TFDS builders: text folder output, split determinism, catalog datasets from a data_dir."""

import os
import random

from etils import epath
import inspect
import pytest
import tensorflow_datasets as tfds

from bipe_jax.data import tfds_builders
from configs import base

WORDS = ('alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi '
         'rho sigma tau upsilon phi chi psi omega').split()


def write_corpus(folder, num_docs: int = 24, seed: int = 0) -> dict:
  """Writes `num_docs` small unique documents (prose and code); returns {doc_id: text}."""
  rng = random.Random(seed)
  os.makedirs(folder, exist_ok=True)
  docs = {}
  for i in range(num_docs):
    if i % 4 == 3:
      name = f'mod_{i:02d}.py'
      text = f'def f{i}(x):\n    return x + {i}\n\n\nclass C{i}:\n  pass\n'
    else:
      name = f'doc_{i:02d}.txt'
      sentences = []
      for _ in range(rng.randint(2, 12)):
        words = ' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        sentences.append(words.capitalize() + rng.choice('.!?'))
      text = f'Document {i}.\n' + ' '.join(sentences) + '\n\n  indented\tline ü\n'
    with open(os.path.join(folder, name), 'w', encoding='utf-8') as f:
      f.write(text)
    docs[name] = text
  return docs


def folder_config(text_dir, data_dir, **overrides):
  c = base.data_defaults()
  c.dataset = 'text_folder'
  c.text_dir = str(text_dir)
  c.data_dir = str(data_dir)
  c.validation_fraction = 0.25
  for k, v in overrides.items():
    c[k] = v
  return c


def read_split(config, split):
  source, feature = tfds_builders.open_split(config, split)
  return [(source[i]['id'].decode(), source[i][feature].decode()) for i in range(len(source))]


def test_text_folder_builder_output_and_determinism(tmp_path):
  docs = write_corpus(tmp_path / 'texts')
  c1 = folder_config(tmp_path / 'texts', tmp_path / 'd1')
  vdir = tfds_builders.build(c1)
  assert vdir.startswith(str(tmp_path / 'd1' / 'bipe_text_folder'))
  train, val = read_split(c1, 'train'), read_split(c1, 'validation')
  assert len(val) == 6 and len(train) == 18
  # Every document exactly once, byte-exact.
  assert sorted(train + val) == sorted(docs.items())
  report = tfds_builders.read_report(c1)
  assert report['documents'] == {'train': 18, 'validation': 6}
  # A second data_dir gives the same split and the same stored order.
  c2 = folder_config(tmp_path / 'texts', tmp_path / 'd2')
  tfds_builders.build(c2)
  assert read_split(c2, 'train') == train and read_split(c2, 'validation') == val
  # Idempotent: the same folder is not rewritten.
  mtime = os.path.getmtime(vdir)
  assert tfds_builders.build(c1) == vdir and os.path.getmtime(vdir) == mtime
  # Editing the folder gives a new dataset (no stale data).
  with open(tmp_path / 'texts' / 'new.txt', 'w') as f:
    f.write('a new document\n')
  vdir2 = tfds_builders.build(c1)
  assert vdir2 != vdir
  assert len(read_split(c1, 'train')) + len(read_split(c1, 'validation')) == 25


def test_build_errors(tmp_path):
  c = folder_config(tmp_path / 'nothing', tmp_path / 'd')
  with pytest.raises(ValueError, match='is not a directory'):
    tfds_builders.build(c)
  (tmp_path / 'one').mkdir()
  (tmp_path / 'one' / 'a.txt').write_text('only one document')
  with pytest.raises(ValueError, match='at least 2 documents'):
    tfds_builders.build(folder_config(tmp_path / 'one', tmp_path / 'd'))
  c = base.data_defaults()
  c.dataset = 'books3'
  with pytest.raises(ValueError, match="data.dataset='books3' is not one of"):
    tfds_builders.dataset_root(c)


def test_text_folder_not_built_is_a_clear_error(tmp_path):
  write_corpus(tmp_path / 'texts', 4)
  c = folder_config(tmp_path / 'texts', tmp_path / 'd')
  with pytest.raises(ValueError, match='is not built.*build_data.py'):
    tfds_builders.open_split(c, 'train')


@pytest.mark.parametrize('dataset,catalog', [('pg19', 'pg19'),
                                             ('arxiv', 'scientific_papers/arxiv')])
def test_missing_catalog_dataset_says_how_to_prepare(tmp_path, dataset, catalog):
  c = base.data_defaults()
  c.dataset, c.data_dir = dataset, str(tmp_path)
  with pytest.raises(ValueError) as err:
    tfds_builders.build(c)
  msg = str(err.value)
  assert f'tfds build {catalog} --data_dir={tmp_path} --file_format=array_record' in msg
  assert 'never downloads' in msg
  assert not os.listdir(tmp_path)  # nothing was downloaded or created


class BipeTestFakePg19(tfds.core.GeneratorBasedBuilder):
  """Stands in for a user-prepared pg19 (same feature name, array_record)."""
  VERSION = tfds.core.Version('0.1.1')

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return epath.Path(inspect.getfile(cls))

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {'book_text': tfds.features.Text(), 'short_book_title': tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    return {'train': self._generate_examples(3), 'validation': self._generate_examples(2)}

  def _generate_examples(self, n):
    for i in range(n):
      yield str(i), {'book_text': f'Book {i}.\nIt was a dark night.\n', 'short_book_title': str(i)}


def test_prepared_catalog_dataset_is_read_from_data_dir(tmp_path):
  tfds.disable_progress_bar()
  builder = BipeTestFakePg19(data_dir=str(tmp_path / 'build'), file_format='array_record')
  builder.download_and_prepare()
  os.makedirs(tmp_path / 'data' / 'pg19')
  os.rename(builder.data_dir, tmp_path / 'data' / 'pg19' / '0.1.1')
  c = base.data_defaults()
  c.dataset, c.data_dir = 'pg19', str(tmp_path / 'data')
  source, feature = tfds_builders.open_split(c, 'validation')
  assert feature == 'book_text' and len(source) == 2
  assert sorted(source[i][feature].decode() for i in range(2)) == [
      'Book 0.\nIt was a dark night.\n', 'Book 1.\nIt was a dark night.\n']
  with pytest.raises(ValueError, match="split 'test' does not exist.*available"):
    tfds_builders.open_split(c, 'test')
  # Without array_record files (e.g. built as tfrecord): a clear error.
  for name in os.listdir(tmp_path / 'data' / 'pg19' / '0.1.1'):
    if '.array_record' in name:
      os.remove(tmp_path / 'data' / 'pg19' / '0.1.1' / name)
  with pytest.raises(ValueError, match='no array_record files.*--file_format=array_record'):
    tfds_builders.open_split(c, 'train')
