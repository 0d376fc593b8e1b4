"""Concatenate-and-split packing and row mixing: hand example, NumPy reference, exact resume."""

import json

import grain
import numpy as np
import pytest

from bipe_jax.data import packing


def docs_dataset(docs):
  return grain.MapDataset.source([np.asarray(d, np.int32) for d in docs]).to_iter_dataset()


def test_hand_example():
  docs = [[1, 5, 6], [1, 7], [1, 8, 9, 10, 11], [1, 12]]
  rows, ids, tail = packing.pack_documents(docs, 4, document_ids=True)
  np.testing.assert_array_equal(rows, [[1, 5, 6, 1], [7, 1, 8, 9], [10, 11, 1, 12]])
  np.testing.assert_array_equal(ids, [[0, 0, 0, 1], [0, 1, 1, 1], [0, 0, 1, 1]])
  assert tail == 0
  got = list(packing.pack_rows(docs_dataset(docs), 4, document_ids=True))
  np.testing.assert_array_equal([g['tokens'] for g in got], rows)
  np.testing.assert_array_equal([g['document_ids'] for g in got], ids)


def random_docs(rng, n, max_len):
  docs = []
  for i in range(n):
    length = int(rng.integers(0, max_len))
    docs.append(np.concatenate([[1], 100 * (i + 1) + np.arange(length)]).astype(np.int32))
  docs.insert(n // 2, np.zeros(0, np.int32))  # an empty document is skipped, not counted
  return docs


def loop_reference(docs, seq_len):
  """Token-by-token reference (independent of `pack_documents`)."""
  rows, ids, row, row_ids, doc_in_row = [], [], [], [], -1
  for d in docs:
    first = True
    for t in d:
      if first:
        doc_in_row = doc_in_row + 1 if row else 0
        first = False
      row.append(t)
      row_ids.append(max(doc_in_row, 0))
      if len(row) == seq_len:
        rows.append(row)
        ids.append(row_ids)
        row, row_ids, doc_in_row = [], [], 0
  return np.array(rows, np.int32).reshape(-1, seq_len), np.array(ids).reshape(-1, seq_len), len(row)


@pytest.mark.parametrize('seed,seq_len,max_len', [(0, 8, 5), (1, 8, 30), (2, 1, 4), (3, 16, 16)])
def test_iterator_matches_references(seed, seq_len, max_len):
  docs = random_docs(np.random.default_rng(seed), 30, max_len)
  ref_rows, ref_ids, ref_tail = loop_reference(docs, seq_len)
  rows, ids, tail = packing.pack_documents(docs, seq_len, document_ids=True)
  np.testing.assert_array_equal(rows, ref_rows)
  np.testing.assert_array_equal(ids, ref_ids)
  assert tail == ref_tail
  it = iter(packing.pack_rows(docs_dataset(docs), seq_len, document_ids=True))
  got = list(it)
  np.testing.assert_array_equal(np.array([g['tokens'] for g in got]).reshape(-1, seq_len), rows)
  np.testing.assert_array_equal(np.array([g['document_ids'] for g in got]).reshape(-1, seq_len),
                                ids)
  # Every token is in a row or in the dropped tail, exactly once.
  assert rows.size + tail == sum(len(d) for d in docs)
  assert it.dropped_tail_tokens == tail
  # A document id restarts at 0 in each row and steps by one exactly where a BOS starts a doc.
  steps = np.diff(ids, axis=1)
  assert set(np.unique(steps)) <= {0, 1}
  np.testing.assert_array_equal(steps == 1, rows[:, 1:] == 1)


def test_resume_from_every_row_gives_the_same_rows():
  docs = random_docs(np.random.default_rng(5), 25, 20)
  ds = packing.pack_rows(docs_dataset(docs), 7, document_ids=True)
  it = iter(ds)
  states, rows = [], []
  while True:
    states.append(json.loads(json.dumps(it.get_state())))  # states are JSON-able
    try:
      rows.append(next(it))
    except StopIteration:
      break
  assert len(rows) > 10
  for k in range(len(rows)):
    fresh = iter(ds)
    fresh.set_state(states[k])
    rest = list(fresh)
    assert len(rest) == len(rows) - k
    for a, b in zip(rest, rows[k:]):
      np.testing.assert_array_equal(a['tokens'], b['tokens'])
      np.testing.assert_array_equal(a['document_ids'], b['document_ids'])


def test_seq_len_and_window_must_be_valid():
  with pytest.raises(ValueError, match='seq_len must be an integer >= 1, got 0'):
    packing.pack_rows(docs_dataset([[1]]), 0)
  with pytest.raises(ValueError, match='data.shuffle_window must be an integer >= 0'):
    packing.mix_rows(docs_dataset([[1]]), -1, seed=0)


def marked_docs(n, length):
  """Document i is BOS + `length` tokens all equal to 10 + i: every token names its document."""
  return [np.concatenate([[1], np.full(length, 10 + i)]).astype(np.int32) for i in range(n)]


def documents_per_batch(batches):
  return [len(set(np.unique(b['tokens'])) - {1}) for b in batches]


def test_mixed_batches_draw_from_many_documents_and_keep_every_row():
  docs = marked_docs(200, 199)  # 200 tokens per document: 25 rows of 8 each
  in_order = list(packing.pack_rows(docs_dataset(docs), 8).batch(10, drop_remainder=True))
  mixed = list(packing.mix_rows(packing.pack_rows(docs_dataset(docs), 8), 1000, seed=3)
               .batch(10, drop_remainder=True))
  assert max(documents_per_batch(in_order)) <= 2  # what training used to see
  assert np.mean(documents_per_batch(mixed)) >= 7  # 10 rows from a window of 40 documents
  # The same rows, only reordered.
  key = lambda batches: sorted(tuple(r) for b in batches for r in b['tokens'])
  assert key(mixed) == key(in_order)


def test_mixed_rows_resume_exactly_mid_window():
  docs = marked_docs(60, 37)
  ds = packing.mix_rows(packing.pack_rows(docs_dataset(docs), 6, document_ids=True), 16, seed=1)
  it = iter(ds)
  for _ in range(21):  # into the second window
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  want = [next(it) for _ in range(30)]
  fresh = iter(ds)
  fresh.set_state(state)
  for a, b in zip([next(fresh) for _ in range(30)], want):
    np.testing.assert_array_equal(a['tokens'], b['tokens'])
    np.testing.assert_array_equal(a['document_ids'], b['document_ids'])
