"""Arithmetic chain-of-thought task of the BiPE paper (He et al. 2024, after Feng et al. 2023).

A problem is an expression over the integers mod a prime p (p = 11 in the paper) with the
operators + - * / and parentheses; its solution is written step by step, each step evaluating
exactly one operator, the steps joined by '=' (see `modular_expressions` for how problems and
their chains are generated, and docs/arithmetic_task.md for the paper's setting):

    3*(10-4)/2=3*6/2=3*3=9         (mod 11)

'=' is the separator, so every step is one BiPE segment. A training row packs
`<bos> problem <eos>` sequences, each row starting with a problem, cut to `seq_len` (the cut
tail is kept as a prefix of a problem). The config (configs/arithmetic_tiny.py) restarts the
positions at every `<bos>` and masks attention across problems, so every problem is seen as
if it were alone in its row (as in Feng et al., one problem per sequence) and its bilevel
positions are: `<bos>` and the expression up to its '=' are segment 0 (intra 0, 1, ...), each
later step one segment (intra from 0), the answer and `<eos>` the last one.

Evaluation prompts are `<bos> expression =`; the model writes the remaining steps and `<eos>`.
Training problems have `train_min_ops..train_max_ops` operators, drawn with probability
proportional to the count (Feng et al. add fewer-operator problems in that proportion);
held-out problems of those counts form the 'test' split, longer ones (`train_max_ops + 1 ..
eval_max_ops`) the 'eval' split.

Data fields read (all optional, with defaults): data.seed, data.seq_len,
data.arithmetic_modulus (11), data.arithmetic_train_min_ops (1), data.arithmetic_train_max_ops
(5), data.arithmetic_eval_max_ops (8).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Sequence

import grain
import numpy as np

from bipe_jax.data import generated
from bipe_jax.data import tokenizer as tokenizer_lib
from bipe_jax.tasks import modular_expressions as expressions

# Vocabulary: specials first (ids 0..2 agree with configs/base.py: unk 0, bos 1, eos 2).
SPECIALS = ('<unk>', '<bos>', '<eos>')
SYMBOLS = expressions.OPERATORS + expressions.PARENTHESES + ('=',)
NUMBERS = tuple(str(i) for i in range(expressions.MAX_MODULUS))
VOCAB = SPECIALS + SYMBOLS + NUMBERS
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SEPARATOR = '='
_PIECE = re.compile(r'10|[0-9]|[-+*/()=]')  # '10' first: numbers are never adjacent
_SPLIT_IDS = {'train': 0, 'eval': 1, 'test': 2}


def split_pieces(text: str) -> list[str]:
  """'3*(10-4)=' -> ['3', '*', '(', '10', '-', '4', ')', '=']; ValueError on other text."""
  pieces = _PIECE.findall(text)
  if ''.join(pieces) != text:
    raise ValueError(f'arithmetic tokenizer: {text!r} has characters outside '
                     f'{"".join(SYMBOLS)} and the numbers 0..{len(NUMBERS) - 1}')
  return pieces


class ArithmeticTokenizer:
  """Tokenizer of the task (one token per number, operator, parenthesis or '='), with the
  data pipeline's Tokenizer interface."""

  path = ''

  def __init__(self):
    self._id = {c: i for i, c in enumerate(VOCAB)}

  @property
  def vocab_size(self) -> int:
    return len(VOCAB)

  @property
  def bos_id(self) -> int:
    return BOS_ID

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def pad_id(self) -> int:
    return -1

  @property
  def unk_id(self) -> int:
    return UNK_ID

  @property
  def separator_id(self) -> int:
    return self._id[SEPARATOR]

  def encode(self, text, add_bos: bool = False, add_eos: bool = False):
    """Text -> ids (a list of strings -> a list of id lists); ValueError on text outside the
    vocabulary. No BOS/EOS unless asked (as the SentencePiece wrapper)."""
    if not isinstance(text, str):
      return [self.encode(t, add_bos, add_eos) for t in text]
    ids = [self._id[c] for c in split_pieces(text)]
    return ([BOS_ID] if add_bos else []) + ids + ([EOS_ID] if add_eos else [])

  def encode_document(self, text: str) -> np.ndarray:
    """int32 [1 + n]: BOS followed by the ids (how the data pipeline packs documents)."""
    return np.asarray(self.encode(text, add_bos=True), np.int32)

  def id_to_piece(self, i: int) -> str:
    return VOCAB[int(i)]

  def pieces(self) -> list[str]:
    return list(VOCAB)

  def decode(self, ids: Iterable[int]) -> str:
    """Ids -> text, special tokens dropped."""
    return ''.join(self.decode_pieces(ids))

  def decode_pieces(self, ids: Iterable[int]) -> list[str]:
    """Ids -> pieces, special tokens dropped; ValueError on an id outside the vocabulary."""
    out = []
    for i in np.asarray(ids).reshape(-1):
      i = int(i)
      if i < 0 or i >= len(VOCAB):
        raise ValueError(f'arithmetic tokenizer: id {i} outside [0, {len(VOCAB)})')
      if i >= len(SPECIALS):
        out.append(VOCAB[i])
    return out

  def separator_ids(self, rule='auto') -> tuple[int, ...]:
    """The step separator '=' for every named rule ('auto', 'sentence', 'newline', 'official':
    this task has one separator); an explicit id list is checked and returned sorted."""
    if isinstance(rule, str):
      if rule in tokenizer_lib.SEPARATOR_RULES:
        return (self.separator_id,)
      raise ValueError(f'separator rule {rule!r}: expected one of {tokenizer_lib.SEPARATOR_RULES} or a list of ids')
    ids = tuple(sorted({int(i) for i in rule}))
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f'separator ids {bad} outside the vocabulary [0, {self.vocab_size})')
    return ids


def get_tokenizer(data_config=None) -> ArithmeticTokenizer:
  del data_config
  return ArithmeticTokenizer()


# ---------------------------------------------------------------------------------------------
# Problems.


@dataclasses.dataclass(frozen=True)
class Problem:
  expression: str
  steps: tuple[str, ...]  # expression first, answer last
  num_ops: int
  modulus: int

  @property
  def answer(self) -> str:
    return self.steps[-1]

  @property
  def text(self) -> str:
    """The full solved problem: 'expr=step=...=answer' (no bos/eos)."""
    return SEPARATOR.join(self.steps)

  @property
  def prompt(self) -> str:
    """What the model is given at evaluation: 'expr='."""
    return self.expression + SEPARATOR


def make_problem(rng: np.random.Generator, num_ops: int, modulus: int) -> Problem:
  """A random problem with `num_ops` operators and its chain (Feng et al.'s generation)."""
  steps = tuple(''.join(s) for s in expressions.solution_chain(rng, num_ops, modulus))
  return Problem(steps[0], steps, num_ops, modulus)


# ---------------------------------------------------------------------------------------------
# Settings, splits and the training iterator.


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  modulus: int = 11
  train_min_ops: int = 1
  train_max_ops: int = 5
  eval_max_ops: int = 8
  seq_len: int = 128
  seed: int = 0

  def train_ops_probabilities(self) -> np.ndarray:
    """float [train_max_ops - train_min_ops + 1]: P(k operators) proportional to k."""
    counts = np.arange(self.train_min_ops, self.train_max_ops + 1, dtype=np.float64)
    return counts / counts.sum()


def settings_from_config(data_config) -> TaskSettings:
  """Reads the task's fields from config.data (ConfigDict or dict), validating them."""
  get = data_config.get
  s = TaskSettings(
      modulus=expressions.check_modulus(get('arithmetic_modulus', 11),
                                        'data.arithmetic_modulus'),
      train_min_ops=int(get('arithmetic_train_min_ops', 1)),
      train_max_ops=int(get('arithmetic_train_max_ops', 5)),
      eval_max_ops=int(get('arithmetic_eval_max_ops', 8)),
      seq_len=int(get('seq_len', 128)),
      seed=int(get('seed', 0)),
  )
  if not 1 <= s.train_min_ops <= s.train_max_ops:
    raise ValueError(f'data.arithmetic_train_min_ops={s.train_min_ops}, '
                     f'data.arithmetic_train_max_ops={s.train_max_ops}: need 1 <= min <= max')
  if s.eval_max_ops <= s.train_max_ops:
    raise ValueError(f'data.arithmetic_eval_max_ops={s.eval_max_ops}: must exceed '
                     f'data.arithmetic_train_max_ops={s.train_max_ops} (eval problems are longer)')
  if s.seq_len < 2:
    raise ValueError(f'data.seq_len={s.seq_len}: must be >= 2')
  return s


def _rng(seed: int, split: str, index: int) -> np.random.Generator:
  return np.random.default_rng([seed, _SPLIT_IDS[split], index])


def split_ops_range(settings: TaskSettings, split: str) -> tuple[int, int]:
  """Inclusive operator-count range of a split: train/test = training range, eval = longer."""
  if split in ('train', 'test'):
    return settings.train_min_ops, settings.train_max_ops
  if split == 'eval':
    return settings.train_max_ops + 1, settings.eval_max_ops
  raise ValueError(f"split {split!r}: allowed 'train', 'test' (held-out, training lengths) or "
                   "'eval' (longer problems)")


def problems_by_length(settings: TaskSettings, split: str, per_length: int,
                       num_ops: Sequence[int] | None = None) -> dict[int, list[Problem]]:
  """`per_length` deterministic problems for each operator count of the split (or `num_ops`)."""
  lo, hi = split_ops_range(settings, split)
  counts = list(num_ops) if num_ops is not None else list(range(lo, hi + 1))
  out = {}
  for n in counts:
    rng = _rng(settings.seed, split, 1_000_003 * n)
    out[n] = [make_problem(rng, n, settings.modulus) for _ in range(per_length)]
  return out


def training_row(settings: TaskSettings, row_index: int) -> np.ndarray:
  """Row `row_index` of the infinite training stream: packed `<bos> problem <eos>` sequences,
  operator counts drawn by `train_ops_probabilities`, cut to seq_len. int32 [seq_len]."""
  rng = _rng(settings.seed, 'train', row_index)
  tok = ArithmeticTokenizer()
  counts = np.arange(settings.train_min_ops, settings.train_max_ops + 1)
  probs = settings.train_ops_probabilities()
  ids: list[int] = []
  while len(ids) < settings.seq_len:
    n = int(rng.choice(counts, p=probs))
    ids += tok.encode(make_problem(rng, n, settings.modulus).text, add_bos=True, add_eos=True)
  return np.asarray(ids[:settings.seq_len], np.int32)


def make_train_iterator(data_config, batch_size_per_process: int, process_index: int = 0,
                        process_count: int = 1):
  """grain iterator of {'tokens': int32 [batch_size_per_process, seq_len]}, infinite,
  deterministic by data.seed, with get_state()/set_state(). Process i takes the global rows
  i, i + process_count, i + 2 * process_count, ... of the stream (a partition across processes);
  each row is a pure function of (seed, global row index), see `training_row`."""
  settings = settings_from_config(data_config)
  if batch_size_per_process < 1:
    raise ValueError(f'batch_size_per_process={batch_size_per_process}: must be >= 1')
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} not in [0, process_count={process_count})')
  rows = grain.MapDataset.range(2**62)[process_index::process_count]
  rows = rows.map(lambda r: {'tokens': training_row(settings, int(r))})
  return iter(rows.to_iter_dataset().batch(batch_size_per_process, drop_remainder=True))


def eval_stream(settings: TaskSettings, split: str = 'validation',
                num_tokens: int = 65536) -> np.ndarray:
  """int32 [num_tokens]: packed `<bos> problem <eos>` sequences of a held-out split
  ('validation'/'test': training lengths; 'eval': longer problems), deterministic."""
  name = 'test' if split in ('validation', 'test') else split
  lo, hi = split_ops_range(settings, name)
  rng = _rng(settings.seed, name, 7_777_777)
  tok = ArithmeticTokenizer()
  parts, total = [], 0
  while total < num_tokens:
    ids = tok.encode(make_problem(rng, int(rng.integers(lo, hi + 1)), settings.modulus).text,
                     add_bos=True, add_eos=True)
    parts.append(ids)
    total += len(ids)
  return np.concatenate(parts).astype(np.int32)[:num_tokens]


def make_eval_blocks(data_config, length: int, split: str = 'validation',
                     max_tokens: int | None = None, stride: int | None = None):
  """(tokens [N, length] int32, target_mask [N, length] bool) over the packed held-out problems
  (same contract as bipe_jax.data.make_eval_blocks; 65536 tokens unless max_tokens). A block
  may start inside a problem: with the task's config that partial problem is positioned from
  the block start, the following ones from their own `<bos>` (accuracy, not perplexity, is the
  task's measure: bipe_jax.evaluation.arithmetic_accuracy)."""
  from bipe_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  settings = settings_from_config(data_config)
  stream = eval_stream(settings, split, int(max_tokens or 65536))
  return pipeline.cut_blocks(stream, length, stride, what=f'the arithmetic {split!r} stream')


DATASET_NAME = 'arithmetic'
generated.register(DATASET_NAME, generated.GeneratedDataset(
    get_tokenizer=get_tokenizer, make_train_iterator=make_train_iterator,
    make_eval_blocks=make_eval_blocks))
