"""Training iterator and evaluation blocks on a generated text folder with a tiny tokenizer."""

import json
import sys

import numpy as np
import pytest

import bipe_jax.data as data_lib
from bipe_jax.data import tfds_builders
from tests.data import test_data_builders as corpus

BOS = 1


@pytest.fixture(scope='module')
def config(tmp_path_factory):
  root = tmp_path_factory.mktemp('pipeline')
  corpus.write_corpus(root / 'texts', 40)
  c = corpus.folder_config(root / 'texts', root / 'data', tokenizer_vocab_size=320,
                           seq_len=16, num_threads=1, prefetch=1, shuffle_window=32)
  prepared = data_lib.prepare(c)
  assert prepared.built and prepared.trained_tokenizer
  again = data_lib.prepare(c)
  assert not again.built and not again.trained_tokenizer  # idempotent
  return c


def split_docs(config, split):
  """The split's documents tokenised independently: {tuple(BOS + ids)}, and the stored order."""
  tok = data_lib.get_tokenizer(config)
  source, feature = tfds_builders.open_split(config, split)
  docs = [tuple([BOS] + tok.encode(source[i][feature].decode())) for i in range(len(source))]
  return docs


def stream_of(it, num_rows):
  rows, ids = [], []
  while len(rows) < num_rows:
    batch = next(it)
    rows.extend(batch['tokens'])
    ids.extend(batch.get('document_ids', [None] * len(batch['tokens'])))
  return np.array(rows[:num_rows]), ids[:num_rows]


def in_order(config):
  """The config with rows in packing order (shuffle_window=0), to read them as one stream."""
  c = config.copy_and_resolve_references()
  c.shuffle_window = 0
  return c


def cut_at_bos(stream):
  starts = list(np.flatnonzero(np.asarray(stream) == BOS)) + [len(stream)]
  assert starts[0] == 0
  return [tuple(int(t) for t in stream[a:b]) for a, b in zip(starts[:-1], starts[1:])]


def test_every_token_once_per_epoch_with_document_ids(config):
  c = in_order(config)
  c.document_ids = True
  docs = split_docs(c, 'train')
  total = sum(len(d) for d in docs)
  it = data_lib.make_train_iterator(c, 3)
  rows, ids = stream_of(it, -(-total // c.seq_len) + 3)
  assert rows.dtype == np.int32 and rows.shape[1] == 16
  stream = rows.reshape(-1)
  first_epoch = cut_at_bos(stream[:total])
  assert sorted(first_epoch) == sorted(docs)  # a permutation of the documents: no loss, no dup
  assert first_epoch != docs  # and shuffled
  ids = np.array(ids)
  np.testing.assert_array_equal(ids[:, 0], 0)
  np.testing.assert_array_equal(np.diff(ids, axis=1), rows[:, 1:] == BOS)
  it.close()


def test_deterministic_for_a_seed(config):
  a = data_lib.make_train_iterator(config, 2)
  b = data_lib.make_train_iterator(config, 2)
  c = config.copy_and_resolve_references()
  c.seed = 7
  d = data_lib.make_train_iterator(c, 2)
  xa, xb, xd = [np.concatenate([next(i)['tokens'] for _ in range(6)]) for i in (a, b, d)]
  np.testing.assert_array_equal(xa, xb)
  assert not np.array_equal(xa, xd)
  assert set(next(a)) == {'tokens'}  # no document ids unless asked for
  for i in (a, b, d):
    i.close()


@pytest.mark.parametrize('skip', [0, 5, 23])  # 23 batches of 2x16 cross the first epoch end
def test_save_restore_gives_the_same_next_batches(config, skip):
  it = data_lib.make_train_iterator(config, 2)
  for _ in range(skip):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  expected = [next(it)['tokens'] for _ in range(6)]
  it.close()
  fresh = data_lib.make_train_iterator(config, 2)
  next(fresh)  # wherever it was, set_state moves it
  fresh.set_state(state)
  got = [next(fresh)['tokens'] for _ in range(6)]
  fresh.close()
  np.testing.assert_array_equal(np.array(got), np.array(expected))


def first_epoch_docs(it, seq_len, limit_rows=400):
  """Documents (as token tuples) a process sees before its first repeated document."""
  stream, _ = stream_of(it, limit_rows)
  seen = []
  for d in cut_at_bos(stream.reshape(-1))[:-1]:
    if d in seen:
      return seen
    seen.append(d)
  raise AssertionError('no epoch boundary within limit_rows')


def test_processes_partition_the_documents(config):
  docs = split_docs(config, 'train')
  per_process = []
  for p in range(3):
    it = data_lib.make_train_iterator(in_order(config), 2, process_index=p, process_count=3)
    per_process.append(first_epoch_docs(it, config.seq_len))
    it.close()
  sets = [set(s) for s in per_process]
  assert all(len(s) == len(p) for s, p in zip(sets, per_process))
  assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
  assert sets[0] | sets[1] | sets[2] == set(docs)


def row_documents(config):
  """{row tuple: index of the document holding its first token} for one in-order epoch."""
  c = in_order(config)
  c.num_epochs = 1
  owner, doc = {}, -1
  for batch in data_lib.make_train_iterator(c, 1):
    row = batch['tokens'][0]
    if row[0] == BOS:
      doc += 1
    owner[tuple(int(t) for t in row)] = max(doc, 0)
    doc += int(np.sum(row[1:] == BOS))
  return owner


def test_a_batch_mixes_rows_of_many_documents(config):
  owner = row_documents(config)
  assert len(set(owner.values())) == 30 and len(owner) > 200  # 30 training documents
  ordered = data_lib.make_train_iterator(in_order(config), 8)
  wide = config.copy_and_resolve_references()
  wide.shuffle_window = len(owner)  # about one epoch of rows
  mixed = data_lib.make_train_iterator(wide, 8)
  def docs_per_batch(it):
    return [len({owner[tuple(int(t) for t in r)] for r in next(it)['tokens']}) for _ in range(4)]
  before, after = docs_per_batch(ordered), docs_per_batch(mixed)
  assert max(before) <= 3 < min(after), (before, after)
  for it in (ordered, mixed):
    it.close()


def test_bad_shuffle_window_names_the_field(config):
  c = config.copy_and_resolve_references()
  c.shuffle_window = -1
  with pytest.raises(ValueError, match='data.shuffle_window'):
    data_lib.make_train_iterator(c, 2)


def test_finite_epochs_stop(config):
  c = config.copy_and_resolve_references()
  c.num_epochs = 1
  total = sum(len(d) for d in split_docs(c, 'train'))
  rows = sum(len(b['tokens']) for b in data_lib.make_train_iterator(c, 1))
  assert rows == total // c.seq_len


@pytest.mark.parametrize('kwargs,match', [
    (dict(batch_size_per_process=0), 'batch_size_per_process must be an integer >= 1'),
    (dict(process_index=2, process_count=2), 'process_index=2 must be < process_count=2'),
    (dict(process_count=1000), 'fewer than process_count=1000'),
])
def test_train_iterator_errors(config, kwargs, match):
  args = dict(batch_size_per_process=2, process_index=0, process_count=1)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    data_lib.make_train_iterator(config, **args)


def test_eval_blocks_official_protocol(config):
  docs = split_docs(config, 'validation')
  stream = np.concatenate([np.array(d, np.int32) for d in docs])  # stored order, BOS per doc
  for length in (16, 48, 100):
    tokens, mask = data_lib.make_eval_blocks(config, length)
    n = len(stream) // length
    assert tokens.shape == mask.shape == (n, length) and tokens.dtype == np.int32
    np.testing.assert_array_equal(tokens.reshape(-1), stream[:n * length])
    assert not mask[:, 0].any() and mask[:, 1:].all()
  # The same stream for every length, capped once.
  t16, _ = data_lib.make_eval_blocks(config, 16, max_tokens=96)
  t48, _ = data_lib.make_eval_blocks(config, 48, max_tokens=96)
  assert t16.shape == (6, 16) and t48.shape == (2, 48)
  np.testing.assert_array_equal(t16.reshape(-1), t48.reshape(-1))


def test_eval_sliding_windows(config):
  docs = split_docs(config, 'validation')
  stream = np.concatenate([np.array(d, np.int32) for d in docs])[:300]
  length, stride = 64, 24
  tokens, mask = data_lib.make_eval_blocks(config, length, max_tokens=300, stride=stride)
  windows, masks, scored = [], [], np.zeros(len(stream), int)
  start = 0
  while start + length <= len(stream):
    windows.append(stream[start:start + length])
    masks.append([t >= length - stride for t in range(length)])
    for t in range(length - stride, length):
      scored[start + t] += 1
    start += stride
  np.testing.assert_array_equal(tokens, windows)
  np.testing.assert_array_equal(mask, masks)
  assert scored.max() == 1  # no token is scored twice
  assert int(mask.sum()) == int(scored.sum())


def test_eval_errors(config):
  n = len(data_lib.eval_stream(config, 'validation'))
  with pytest.raises(ValueError, match=f"'validation' split.* has {n} tokens, fewer than one "
                                       f'block of length {n + 1}'):
    data_lib.make_eval_blocks(config, n + 1)
  with pytest.raises(ValueError, match='capped at max_tokens=10 has 10 tokens.*length 16'):
    data_lib.make_eval_blocks(config, 16, max_tokens=10)
  with pytest.raises(ValueError, match='stride=20 must be <= length=16'):
    data_lib.make_eval_blocks(config, 16, stride=20)
  with pytest.raises(ValueError, match='length must be an integer >= 2'):
    data_lib.make_eval_blocks(config, 1)
  with pytest.raises(ValueError, match="split 'test' does not exist"):
    data_lib.make_eval_blocks(config, 16, split='test')


def test_tokenizer_entry_points(config, tmp_path):
  tok = data_lib.get_tokenizer(config)
  assert tok.vocab_size == 320 and tok.path == data_lib.tokenizer_path(config)
  assert tok.path.endswith('spm_bpe_320.model')
  with pytest.raises(ValueError, match='model.vocab_size=4096 does not match'):
    data_lib.check_vocab_size(tok, 4096)
  c = config.copy_and_resolve_references()
  c.tokenizer_path = tok.path  # an explicit model file
  assert data_lib.get_tokenizer(c).vocab_size == 320
  c.tokenizer_path = str(tmp_path / 'nope.model')
  with pytest.raises(ValueError, match='tokenizer_path=.*does not exist'):
    data_lib.get_tokenizer(c)
  c = config.copy_and_resolve_references()
  c.tokenizer_vocab_size = 512  # no tokenizer of that size yet
  with pytest.raises(ValueError, match='no tokenizer at .*spm_bpe_512.model.*prepare'):
    data_lib.get_tokenizer(c)


def test_generated_datasets_are_delegated_to_their_registered_hooks(config, monkeypatch):
  from bipe_jax.data import generated  # pylint: disable=import-outside-toplevel
  prepared = []
  fake = generated.GeneratedDataset(
      get_tokenizer=lambda cfg: ('tok', cfg.dataset),
      make_train_iterator=lambda cfg, b, i, n: ('it', b, i, n),
      make_eval_blocks=lambda cfg, length, split, max_tokens, stride: ('ev', length, stride),
      prepare=lambda cfg: prepared.append(cfg.dataset))
  monkeypatch.setitem(generated._REGISTRY, 'fake_task', fake)  # pylint: disable=protected-access
  c = config.copy_and_resolve_references()
  c.dataset = 'fake_task'
  assert data_lib.get_tokenizer(c) == ('tok', 'fake_task')
  assert data_lib.make_train_iterator(c, 4, 1, 2) == ('it', 4, 1, 2)
  assert data_lib.make_eval_blocks(c, 32, stride=8) == ('ev', 32, 8)
  data_lib.prepare(c)
  assert prepared == ['fake_task']
