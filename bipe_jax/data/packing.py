"""Concatenate-and-split packing as a checkpointable grain transformation.

Documents (int32 arrays that start with BOS) are laid end to end and cut into rows of exactly
`seq_len` tokens, as the BiPE paper trains: a document that does not fit continues at the start
of the next row, so no token is dropped or padded. With `document_ids=True` each row also gets
`document_ids` [seq_len] int32: 0 for the first document (fragment) in the row, +1 at every new
document, so attention and bilevel positions can restart per document.

Iterator state = (parent state before the document holding the next row's first token, offset
of that token in the document). Restoring re-reads that one document and skips `offset` tokens,
so the state stays small (no token buffer) and resumes exactly. On a finite parent the last,
incomplete row is not emitted: its size is logged as a warning and kept in
`dropped_tail_tokens` (training repeats forever by default, so nothing is dropped there).
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
    if seq_len < 1:
      raise ValueError(f'seq_len must be >= 1, got {seq_len}')
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
