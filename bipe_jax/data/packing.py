"""Training rows: concatenate-and-split packing, then rows mixed across documents.

Packing (`pack_rows`): documents (int32 arrays that start with BOS) are laid end to end and cut
into rows of exactly `seq_len` tokens, as the BiPE paper trains: a document that does not fit
continues at the start of the next row, so no token is dropped or padded. With
`document_ids=True` each row also gets `document_ids` [seq_len] int32: 0 for the first document
(fragment) in the row, +1 at every new document, so attention and bilevel positions can restart
per document. `PackedRowsIterDataset` does it lazily; `pack_documents` is the small NumPy
reference the tests compare against. Its iterator state = (parent state before the document
holding the next row's first token, offset of that token in the document): restoring re-reads
that one document and skips `offset` tokens, so the state stays small and resumes exactly. On a
finite input the last, incomplete row is not emitted (logged, and kept in
`dropped_tail_tokens`). Why not grain's `ConcatThenSplitIterDataset` (grain 0.2.18): measured,
it gives the same rows and document ids (its segment ids minus one) at the same ~13k rows/s,
but restoring its state did not reproduce the rows from 6 of the 31 states of the resume test
in tests/data/test_data_packing.py, and exact resume is what this pipeline promises.

Mixing (`mix_rows`): packed rows come out in document order, so a batch of consecutive rows is
one or two documents (an embedded-corpus document is ~5k tokens, a PG-19 book ~100k), and
consecutive gradients come from the same file: measured on the embedded corpus, the tiny preset
at length 128 then ends near the unigram level. The official BiPE training shuffles the packed
chunks globally (a random sampler over `group_texts` output). Here a grain
`WindowShuffleIterDataset` shuffles each window of `window_rows` consecutive packed rows (with a
different seed per window); documents are shuffled before packing too, so a window holds about
`window_rows * seq_len / document_length` documents drawn at random from the split. Why a window
and not a global shuffle of pre-packed rows: a global shuffle must tokenise and pack the whole
split before the first step (the whole of PG-19 is ~2B tokens) and hold its row index, while a
window needs only `window_rows` rows in memory and starts in well under a second. Measured on
the embedded corpus, batch 32, 100 batches (benchmarks/README.md, "Mixing packed rows"): rows in
order put 1.5 documents in a batch on average at length 64 (1.6 at 128); a 4096-row window puts
20.5 (14.8), and the first batch arrives after 0.6 s. Its state is the parent's state at
the window start plus the position in the window: restoring re-reads and re-packs one window,
so resume is exact and the state stays small.
"""

import logging
from typing import Any

import grain
import numpy as np


def pack_documents(docs, seq_len: int, document_ids: bool = False):
  """Reference packer on a list of documents: (rows [N, seq_len], doc_ids [N, seq_len], tail).

  Pure NumPy; the grain iterator below produces the same rows lazily.
  """
  stream = np.concatenate([np.asarray(d, np.int32) for d in docs]) if docs else np.zeros(0, np.int32)
  starts = np.zeros(len(stream), bool)
  offsets = np.cumsum([0] + [len(d) for d in docs[:-1]]) if docs else []
  starts[[o for o, d in zip(offsets, docs) if len(d)]] = True
  n = len(stream) // seq_len
  rows = stream[:n * seq_len].reshape(n, seq_len)
  s = starts[:n * seq_len].reshape(n, seq_len).copy()
  s[:, 0] = False  # the row's first fragment is document 0 whether or not it starts there
  ids = np.cumsum(s, axis=1).astype(np.int32)
  return rows, (ids if document_ids else None), len(stream) - n * seq_len


class PackedRowsIterDataset(grain.IterDataset):
  """Packs a dataset of 1-D int32 documents into dicts {'tokens': [seq_len], 'document_ids'?}."""

  def __init__(self, parent: grain.IterDataset, seq_len: int, document_ids: bool = False):
    super().__init__(parent)
    if isinstance(seq_len, bool) or int(seq_len) != seq_len or seq_len < 1:
      raise ValueError(f'seq_len must be an integer >= 1, got {seq_len!r}')
    self._seq_len = seq_len
    self._document_ids = document_ids

  def __iter__(self):
    return PackedRowsIterator(self._parent.__iter__(), self._seq_len, self._document_ids)

  def __str__(self):
    return f'PackedRowsIterDataset(seq_len={self._seq_len}, document_ids={self._document_ids})'


class PackedRowsIterator(grain.DatasetIterator):
  """The iterator of `PackedRowsIterDataset` (see the module docstring for its state)."""

  def __init__(self, parent: grain.DatasetIterator, seq_len: int, document_ids: bool):
    super().__init__(parent)
    self._seq_len = seq_len
    self._document_ids = document_ids
    self._doc = None  # the current document, or None before the first pull / after a restore
    self._doc_state = parent.get_state()  # parent state before self._doc was pulled
    self._pos = 0  # tokens of self._doc already emitted (or to skip after a restore)
    self.dropped_tail_tokens = 0

  def _pull(self) -> bool:
    """Moves to the next document (or re-reads the restored one); False when exhausted."""
    if self._doc is not None:
      self._doc_state = self._parent.get_state()
      self._pos = 0
    try:
      doc = next(self._parent)
    except StopIteration:
      return False
    self._doc = np.asarray(doc, np.int32).reshape(-1)
    return True

  def __next__(self) -> dict[str, np.ndarray]:
    seq_len = self._seq_len
    tokens = np.empty(seq_len, np.int32)
    ids = np.zeros(seq_len, np.int32) if self._document_ids else None
    filled, doc_index = 0, 0
    while filled < seq_len:
      if self._doc is None or self._pos >= len(self._doc):
        if not self._pull():
          if filled:
            self.dropped_tail_tokens += filled
            logging.warning('packing: the input ended inside a row; dropped its last %d tokens '
                            '(fewer than seq_len=%d)', filled, seq_len)
          raise StopIteration
        if self._pos >= len(self._doc):
          continue
        if filled:  # a document starts inside this row
          doc_index += 1
      take = min(seq_len - filled, len(self._doc) - self._pos)
      tokens[filled:filled + take] = self._doc[self._pos:self._pos + take]
      if ids is not None:
        ids[filled:filled + take] = doc_index
      filled += take
      self._pos += take
    out = {'tokens': tokens}
    if ids is not None:
      out['document_ids'] = ids
    return out

  def get_state(self) -> dict[str, Any]:
    return {'parent': self._doc_state, 'offset': int(self._pos)}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state['parent'])
    self._doc_state = state['parent']
    self._doc = None
    self._pos = int(state['offset'])

  def __str__(self):
    return f'PackedRowsIterator(seq_len={self._seq_len})'

def pack_rows(documents: grain.IterDataset, seq_len: int,
              document_ids: bool = False) -> grain.IterDataset:
  """Packs 1-D int32 documents into {'tokens': [seq_len], 'document_ids'?: [seq_len]} rows."""
  return PackedRowsIterDataset(documents, seq_len, document_ids)


def mix_rows(rows: grain.IterDataset, window_rows: int, seed: int) -> grain.IterDataset:
  """Rows shuffled within windows of `window_rows` (0 or 1: unchanged order). See the docstring."""
  if isinstance(window_rows, bool) or int(window_rows) != window_rows or window_rows < 0:
    raise ValueError(f'data.shuffle_window must be an integer >= 0 (rows), got {window_rows!r}')
  if window_rows <= 1:
    return rows
  return grain.experimental.WindowShuffleIterDataset(rows, window_size=int(window_rows),
                                                     seed=int(seed))
