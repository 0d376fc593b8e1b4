"""Synthetic passkey retrieval: a task small models can be trained on at one length and probed
at longer ones (the standard long-context retrieval probe, as a training task for CPU models).

A sample is exactly `length` tokens:
  <bos> filler sentences ... KEY IS d d d d d . filler sentences ... ? ANS d d d d d <eos>
Filler sentences are 3..8 random filler words ended by '.', so every sentence is one BiPE
segment (the separator is '.'). The key sentence sits at a chosen depth (0 = first sentence,
1 = last before the question). A model answers right when, given everything up to ANS, greedy
decoding produces the 5 key digits; because greedy decoding of the key is right exactly when
the argmax at each key position is the key digit given the true earlier digits, one
teacher-forced forward pass scores a batch (`bipe_jax.evaluation.passkey`).

Training rows hold one sample each (seq_len tokens, depth uniform in [0, 1]); the loss is on
the answer only (`loss_mask`: the 5 digits after ANS and <eos>): the filler and the key itself
are random, and with the loss on every token their irreducible loss drowns the 6 learnable
targets of a row (measured: 2000 steps at length 64, loss on all tokens, neither rope nor
bipe_rope retrieved a single key). The task registers itself as
`data.dataset='passkey'` (bipe_jax.data.generated); configs/passkey_tiny.py trains it.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import grain
import numpy as np

from bipe_jax.data import generated
from bipe_jax.data import tokenizer as tokenizer_lib

SPECIALS = ('<pad>', '<bos>', '<eos>')
DIGITS = tuple(str(d) for d in range(10))
MARKERS = ('.', 'KEY', 'IS', '?', 'ANS')
NUM_FILLER = 16
FILLER = tuple(f'w{i}' for i in range(NUM_FILLER))
VOCAB = SPECIALS + DIGITS + MARKERS + FILLER
KEY_DIGITS = 5
# Tokens of a sample besides the filler: <bos>, KEY IS d*5 ., ? ANS d*5 <eos>.
FIXED_TOKENS = 1 + (2 + KEY_DIGITS + 1) + (2 + KEY_DIGITS + 1)
DATASET_NAME = 'passkey'


class PasskeyTokenizer:
  """Whitespace-separated pieces of VOCAB, with the data pipeline's Tokenizer interface."""

  path = ''
  vocab_size = len(VOCAB)
  bos_id, eos_id, pad_id = 1, 2, -1

  def __init__(self):
    self._id = {p: i for i, p in enumerate(VOCAB)}

  def id_of(self, piece: str) -> int:
    return self._id[piece]

  def encode(self, text, add_bos: bool = False, add_eos: bool = False):
    if not isinstance(text, str):
      return [self.encode(t, add_bos, add_eos) for t in text]
    try:
      ids = [self._id[p] for p in text.split()]
    except KeyError as e:
      raise ValueError(f'passkey tokenizer: piece {e} is not in the vocabulary') from None
    return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

  def decode(self, ids: Iterable[int]) -> str:
    out = []
    for i in np.asarray(ids).reshape(-1):
      if not 0 <= int(i) < len(VOCAB):
        raise ValueError(f'passkey tokenizer: id {int(i)} outside [0, {len(VOCAB)})')
      if int(i) >= len(SPECIALS):
        out.append(VOCAB[int(i)])
    return ' '.join(out)

  def pieces(self) -> list[str]:
    return list(VOCAB)

  def separator_ids(self, rule='auto') -> tuple[int, ...]:
    """'.' for every named rule (each sentence a segment); explicit ids are checked."""
    if isinstance(rule, str):
      if rule in tokenizer_lib.SEPARATOR_RULES:
        return (self._id['.'],)
      raise ValueError(f'separator rule {rule!r}: expected one of '
                       f'{tokenizer_lib.SEPARATOR_RULES} or a list of ids')
    ids = tuple(sorted({int(i) for i in rule}))
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f'separator ids {bad} outside the vocabulary [0, {self.vocab_size})')
    return ids


@dataclasses.dataclass(frozen=True)
class Sample:
  """One sample: ids int32 [length]; the key; where the answer digits are (their positions)."""
  ids: np.ndarray
  key: str
  answer_positions: np.ndarray  # int [KEY_DIGITS]: positions of the answer digits in ids
  depth: float


def _filler(rng: np.random.Generator, num_tokens: int) -> list[list[str]]:
  """Sentences of 3..8 filler words + '.', exactly `num_tokens` tokens in all (>= 0)."""
  sentences, left = [], num_tokens
  while left > 0:
    n = min(left, int(rng.integers(4, 10)))  # words + '.'
    if left - n in (1, 2, 3):  # never leave a remainder too short for a sentence
      n = left
    sentences.append([FILLER[int(i)] for i in rng.integers(0, NUM_FILLER, n - 1)] + ['.'])
    left -= n
  return sentences


def make_sample(rng: np.random.Generator, length: int, depth: float | None = None) -> Sample:
  """A sample of exactly `length` tokens with the key at `depth` (None: uniform)."""
  filler_tokens = length - FIXED_TOKENS
  if filler_tokens < 4:
    raise ValueError(f'passkey: length {length} is too short (at least {FIXED_TOKENS + 4})')
  key = ''.join(str(int(d)) for d in rng.integers(0, 10, KEY_DIGITS))
  sentences = _filler(rng, filler_tokens)
  depth = float(rng.uniform()) if depth is None else float(depth)
  at = int(round(depth * len(sentences)))
  needle = ['KEY', 'IS', *key, '.']
  body = [w for s in sentences[:at] for w in s] + needle + [w for s in sentences[at:] for w in s]
  pieces = ['<bos>', *body, '?', 'ANS', *key, '<eos>']
  tok = PasskeyTokenizer()
  ids = np.asarray([tok.id_of(p) for p in pieces], np.int32)
  start = len(pieces) - 1 - KEY_DIGITS
  return Sample(ids, key, np.arange(start, start + KEY_DIGITS), depth)


def _rng(seed: int, split: str, index: int) -> np.random.Generator:
  return np.random.default_rng([seed, {'train': 0, 'validation': 1, 'probe': 2}[split], index])


def _row(sample: Sample) -> dict:
  """{'tokens': int32 [L], 'loss_mask': bool [L], True on the answer digits and <eos>}."""
  mask = np.zeros(sample.ids.shape, bool)
  mask[sample.answer_positions[0]:] = True
  return {'tokens': sample.ids, 'loss_mask': mask}


def make_train_iterator(data_config, batch_size_per_process: int, process_index: int = 0,
                        process_count: int = 1):
  """grain iterator of {'tokens': int32, 'loss_mask': bool} [batch, seq_len]: one sample per
  row (the loss on its answer), infinite,
  deterministic by data.seed (row r is a pure function of (seed, r)); get_state/set_state."""
  seq_len, seed = int(data_config.seq_len), int(data_config.get('seed', 0))
  make_sample(np.random.default_rng(0), seq_len)  # a clear error for a too short seq_len
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} not in [0, process_count={process_count})')
  rows = grain.MapDataset.range(2**62)[process_index::process_count]
  rows = rows.map(lambda r: _row(make_sample(_rng(seed, 'train', int(r)), seq_len)))
  return iter(rows.to_iter_dataset().batch(batch_size_per_process, drop_remainder=True))


def make_eval_blocks(data_config, length: int, split: str = 'validation',
                     max_tokens: int | None = None, stride: int | None = None):
  """(tokens [N, length], target_mask [N, length]): held-out samples of `length` tokens (one
  per block, scored on the answer as in training; the same contract as
  bipe_jax.data.make_eval_blocks, 65536 tokens unless max_tokens; `stride` is not supported:
  samples do not overlap)."""
  if stride is not None:
    raise ValueError('passkey: evaluation blocks are whole samples; stride is not supported')
  count = max(1, int(max_tokens or 65536) // length)
  seed = int(data_config.get('seed', 0))
  rows = [_row(make_sample(_rng(seed, 'validation', i), length)) for i in range(count)]
  return np.stack([r['tokens'] for r in rows]), np.stack([r['loss_mask'] for r in rows])


def get_tokenizer(data_config=None) -> PasskeyTokenizer:
  del data_config
  return PasskeyTokenizer()


generated.register(DATASET_NAME, generated.GeneratedDataset(
    get_tokenizer=get_tokenizer, make_train_iterator=make_train_iterator,
    make_eval_blocks=make_eval_blocks))
