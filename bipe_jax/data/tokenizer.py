"""SentencePiece tokenizers: training, loading, separator tables, vocab-size checks.

Trained tokenizers keep text byte-exact: identity normalisation, no whitespace folding, no
dummy prefix, byte fallback (no `<unk>` for unseen characters) and the newline as its own piece
(a user-defined symbol), because the newline is a BiPE segment separator. Special ids follow
configs/base.py: unk 0, bos 1, eos 2, no pad piece (pad_id -1).

Separator rules (`Tokenizer.separator_ids`), the paper's segments: a full stop that ends a
sentence, '!' and '?', and a newline for text; newlines only for code.
  'sentence'  newline pieces, plus every piece that is sentence-final punctuation: one '.', '!'
              or '?', with only closing quotes / brackets around it (').', '."', '.")', "'.",
              '!', '?', ...), and the period after a space ('▁.', the official code's id 869).
              NOT marked: pieces that also occur inside code or numbers ('(?', '▁{!', '!=',
              '._', '__.', '...', '..', '().'), and the bare '.' piece. A rule on pieces alone
              cannot decide the bare '.': this tokenizer emits the same piece for a decimal point
              ('3.5' -> '3' '.' '5'), inside an abbreviation ('e.g.') and after a word at the end
              of a sentence ('units.' -> 'its' '.'). We never split on it, so decimal points and
              abbreviations never end a segment, and a sentence whose period is that piece ends
              its segment at the next newline or unambiguous punctuation (the official models
              likewise split on '▁.' and newline only: config.OFFICIAL_SEPARATOR_IDS). For prose with one
              sentence per line nothing is lost; hard-wrapped text splits at its line ends.
              Likewise a bare '!' or '?' piece is taken as sentence-final although code can
              produce it ('{x!r}' in an f-string): use 'newline' for code.
  'auto'      the same as 'sentence' here; at the config level (`model.separators='auto'`) it
              means the dataset's default rule (bipe_jax.data.preparation.default_separator_rule:
              'newline' for a folder of code files, 'sentence' otherwise).
  'newline'   only newline pieces (the paper's choice for code);
  'official'  the released BiPE models' ids {869, 13}, accepted only when this tokenizer's pieces
              at those ids are the Llama tokenizer's ('▁.' and '<0x0A>'); any other tokenizer is
              an error naming the pieces found (pass the ids explicitly to override);
  a sequence of ints: explicit ids.

Known SentencePiece limitation: the space marker character '▁' (U+2581) itself in the input text
decodes back as a space.
"""

import io
from typing import Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from bipe_jax import storage

OFFICIAL_SEPARATOR_IDS = (869, 13)
SEPARATOR_RULES = ('auto', 'sentence', 'newline', 'official')
OFFICIAL_SEPARATOR_PIECES = ('\u2581.', '<0x0A>')
MODEL_TYPES = ('bpe', 'unigram')
SPACE_MARKER = '\u2581'  # '▁'
NEWLINE_BYTE_PIECE = '<0x0A>'
SENTENCE_END = ('.', '!', '?')
CLOSING = ')]}"\'\u201d\u2019'  # brackets and quotes that may follow or precede a sentence end
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, -1


def is_newline_piece(piece: str) -> bool:
  return '\n' in piece or piece == NEWLINE_BYTE_PIECE


def is_sentence_end_piece(piece: str) -> bool:
  """Unambiguous sentence-final punctuation (see the module docstring): exactly one '.', '!' or
  '?' with only closing quotes / brackets around it, not the bare '.' piece."""
  if piece == '.':
    return False  # a decimal point, an abbreviation or a sentence end: undecidable alone
  stripped = piece.lstrip(SPACE_MARKER)
  if SPACE_MARKER in stripped:
    return False
  marks = [c for c in stripped if c in SENTENCE_END]
  if len(marks) != 1:
    return False
  return all(c in SENTENCE_END or c in CLOSING for c in stripped)


class Tokenizer:
  """A SentencePiece model with the ids and separator table the rest of the library needs."""

  def __init__(self, path: str):
    if not storage.isfile(path):  # a local file or a URL (gs://...)
      raise ValueError(f'tokenizer model file {path!r} does not exist')
    self.path = path
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(storage.read_bytes(path))
    except (OSError, RuntimeError) as e:
      raise ValueError(f'{path!r} is not a SentencePiece model: {e}') from e

  @property
  def vocab_size(self) -> int:
    return self._sp.GetPieceSize()

  @property
  def bos_id(self) -> int:
    return self._sp.bos_id()

  @property
  def eos_id(self) -> int:
    return self._sp.eos_id()

  @property
  def pad_id(self) -> int:
    return self._sp.pad_id()

  @property
  def unk_id(self) -> int:
    return self._sp.unk_id()

  def encode(self, text: str | Sequence[str], num_threads: int = 1):
    """Token ids of a string (list[int]) or of a list of strings (list[list[int]], encoded on
    `num_threads` SentencePiece threads), no BOS."""
    return self._sp.Encode(text, num_threads=num_threads)

  def encode_document(self, text: str) -> np.ndarray:
    """int32 [1 + n]: BOS followed by the document's ids (how documents are packed)."""
    ids = self._sp.Encode(text)
    out = np.empty(len(ids) + 1, np.int32)
    out[0] = self.bos_id
    out[1:] = ids
    return out

  def decode(self, ids) -> str:
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    return self._sp.Decode(ids)

  def id_to_piece(self, i: int) -> str:
    return self._sp.IdToPiece(int(i))

  def pieces(self) -> list[str]:
    return [self._sp.IdToPiece(i) for i in range(self.vocab_size)]

  def separator_ids(self, rule='auto') -> tuple[int, ...]:
    """Sorted separator ids for `rule` ('auto' | 'sentence' | 'newline' | 'official' | ids)."""
    v = self.vocab_size
    if isinstance(rule, str):
      if rule not in SEPARATOR_RULES:
        raise ValueError(f'separator rule {rule!r} is not one of {SEPARATOR_RULES} or a list '
                         'of ids')
      if rule == 'official':
        if v <= max(OFFICIAL_SEPARATOR_IDS):
          raise ValueError(f"separator rule 'official' uses ids {OFFICIAL_SEPARATOR_IDS} of the "
                           f'Llama tokenizer (vocab 32000); {self.path} has vocab_size {v}')
        pieces = tuple(self.id_to_piece(i) for i in OFFICIAL_SEPARATOR_IDS)
        if pieces != OFFICIAL_SEPARATOR_PIECES:
          raise ValueError(
              f"separator rule 'official' means ids {OFFICIAL_SEPARATOR_IDS} = pieces "
              f"{list(OFFICIAL_SEPARATOR_PIECES)} of the Llama tokenizer, but in {self.path} they "
              f"are {list(pieces)}: use a rule ('sentence' / 'newline' / 'auto'), or pass the ids "
              f"explicitly (separators='ids') if you really mean them")
        return tuple(sorted(OFFICIAL_SEPARATOR_IDS))
      out = []
      for i in range(v):
        if self._sp.IsControl(i) or self._sp.IsUnknown(i):
          continue
        piece = self.id_to_piece(i)
        if is_newline_piece(piece):
          out.append(i)
        elif (rule in ('auto', 'sentence') and not self._sp.IsByte(i)
              and is_sentence_end_piece(piece)):
          out.append(i)
      return tuple(out)
    ids = tuple(sorted({int(i) for i in rule}))
    bad = [i for i in ids if not 0 <= i < v]
    if bad:
      raise ValueError(f'separator ids {bad} are outside the vocabulary [0, {v}) of {self.path}')
    return ids


def check_vocab_size(tokenizer: Tokenizer, model_vocab_size: int, *,
                     allow_larger_model: bool = False) -> None:
  """Raises a ValueError when the model's vocab_size and the tokenizer's disagree.

  `allow_larger_model` accepts a model table padded beyond the tokenizer (never smaller).
  """
  v = tokenizer.vocab_size
  if v == model_vocab_size or (allow_larger_model and model_vocab_size > v):
    return
  raise ValueError(f'model.vocab_size={model_vocab_size} does not match the tokenizer '
                   f'{tokenizer.path} (vocab_size {v}); set model.vocab_size={v} or train a '
                   f'tokenizer with --vocab_size={model_vocab_size}')


def training_chunks(texts: Iterable[str], max_bytes: int = 4000) -> Iterator[str]:
  """Cuts documents at line ends into pieces of at most `max_bytes` (SentencePiece 'sentences').

  Newlines stay inside the chunks so the trainer sees them in context; a single line longer
  than `max_bytes` is cut (for training only).
  """
  for text in texts:
    buf, size = [], 0
    for line in text.splitlines(keepends=True):
      n = len(line.encode('utf-8'))
      if n > max_bytes:
        line = line.encode('utf-8')[:max_bytes].decode('utf-8', 'ignore')
        n = len(line.encode('utf-8'))
      if buf and size + n > max_bytes:
        yield ''.join(buf)
        buf, size = [], 0
      buf.append(line)
      size += n
    if buf:
      yield ''.join(buf)


def train_tokenizer(texts: Iterable[str], path: str, *, model_type: str = 'bpe',
                    vocab_size: int = 4096, max_characters: int = 50_000_000,
                    num_threads: int = 2, seed: int = 0) -> Tokenizer:
  """Trains a SentencePiece model on `texts` (documents) and writes it to `path` atomically.

  At most `max_characters` of text are used (documents in the given order).
  """
  if model_type not in MODEL_TYPES:
    raise ValueError(f'tokenizer model_type {model_type!r} is not one of {MODEL_TYPES}')
  minimum = 256 + 4  # byte pieces, unk/bos/eos and the newline piece
  if vocab_size <= minimum:
    raise ValueError(f'tokenizer vocab_size={vocab_size} is too small: byte fallback needs more '
                     f'than {minimum} pieces')

  def limited():
    used = 0
    for text in texts:
      if used >= max_characters:
        return
      used += len(text)
      yield text

  chunks = [c for c in training_chunks(limited()) if c]
  if not chunks:
    raise ValueError('cannot train a tokenizer on an empty corpus')
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(chunks), model_writer=model, model_type=model_type,
        vocab_size=vocab_size, byte_fallback=True, normalization_rule_name='identity',
        remove_extra_whitespaces=False, add_dummy_prefix=False, split_digits=True,
        allow_whitespace_only_pieces=True, user_defined_symbols=['\n'],
        unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID,
        input_sentence_size=2_000_000, shuffle_input_sentence=True, max_sentence_length=8192,
        character_coverage=0.9995, num_threads=num_threads, minloglevel=2)
  except RuntimeError as e:
    raise ValueError(f'SentencePiece could not train a {model_type} tokenizer with vocab_size='
                     f'{vocab_size} on {len(chunks)} chunks of text: {e}') from e
  storage.write_bytes_atomic(path, model.getvalue())  # a local file or gs://...
  return Tokenizer(path)
