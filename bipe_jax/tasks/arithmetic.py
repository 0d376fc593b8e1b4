"""Arithmetic chain-of-thought task: modular expressions solved one reduction per step.

A problem is an expression over the integers mod `p` (p <= 10, so every number is one
character) with the operators + - * and parentheses. Its solution is written step by step,
each step doing exactly one reduction (one operator applied, and the parentheses around a
number that results removed in the same step); the steps are joined by '=', the separator
token, so every step is one BiPE segment:

    3*(4+5)-1=3*2-1=6-1=5         (mod 7)

A training row is a packed stream of `<bos> problem <eos>` sequences cut to `seq_len`.
Evaluation prompts are `<bos> expression =`; the model must write the remaining steps and the
final answer, then `<eos>`. The train/eval split is by length: training problems have
`train_min_ops..train_max_ops` operators, evaluation problems `train_max_ops+1..eval_max_ops`.

Data fields read (all optional, with defaults): data.seed, data.seq_len,
data.arithmetic_modulus (7), data.arithmetic_train_min_ops (1), data.arithmetic_train_max_ops (5),
data.arithmetic_eval_max_ops (8).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import grain
import numpy as np

# Vocabulary: specials first (ids 0..2 agree with configs/base.py: unk 0, bos 1, eos 2).
SPECIALS = ('<unk>', '<bos>', '<eos>')
CHARS = tuple('0123456789') + ('+', '-', '*', '(', ')', '=')
VOCAB = SPECIALS + CHARS
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SEPARATOR = '='
OPERATORS = ('+', '-', '*')
_PRECEDENCE = {'+': 1, '-': 1, '*': 2}
_SPLIT_IDS = {'train': 0, 'eval': 1, 'test': 2}


class ArithmeticTokenizer:
  """Character-level tokenizer with the data pipeline's Tokenizer interface."""

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

  def encode(self, text, add_bos: bool = False, add_eos: bool = False):
    """Characters -> ids (a list of strings -> a list of id lists); a character outside the
    vocabulary is a ValueError. No BOS/EOS unless asked (as the SentencePiece wrapper)."""
    if not isinstance(text, str):
      return [self.encode(t, add_bos, add_eos) for t in text]
    ids = []
    for ch in text:
      if ch not in self._id or ch in SPECIALS:
        raise ValueError(f'arithmetic tokenizer: character {ch!r} is not in the vocabulary '
                         f'{"".join(CHARS)!r}')
      ids.append(self._id[ch])
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
    out = []
    for i in np.asarray(ids).reshape(-1):
      i = int(i)
      if i < 0 or i >= len(VOCAB):
        raise ValueError(f'arithmetic tokenizer: id {i} outside [0, {len(VOCAB)})')
      if i >= len(SPECIALS):
        out.append(VOCAB[i])
    return ''.join(out)

  def separator_ids(self, rule='auto') -> tuple[int, ...]:
    """The step separator '=' for every named rule ('auto', 'newline', 'official': this task
    has one separator); an explicit id list is checked and returned sorted."""
    if isinstance(rule, str):
      if rule in ('auto', 'newline', 'official'):
        return (self._id[SEPARATOR],)
      raise ValueError(f"separator rule {rule!r}: expected 'auto', 'newline', 'official' or a "
                       'list of ids')
    ids = tuple(sorted({int(i) for i in rule}))
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f'separator ids {bad} outside the vocabulary [0, {self.vocab_size})')
    return ids


def get_tokenizer(data_config=None) -> ArithmeticTokenizer:
  del data_config
  return ArithmeticTokenizer()


# ---------------------------------------------------------------------------------------------
# Generation and step-by-step solution (pure Python on character lists).


def random_expression(rng: np.random.Generator, num_ops: int, modulus: int) -> str:
  """A random expression with exactly `num_ops` operators and only the parentheses it needs."""
  return _render(_random_tree(rng, num_ops, modulus))


def _random_tree(rng, num_ops, modulus):
  if num_ops == 0:
    return int(rng.integers(modulus))
  op = OPERATORS[int(rng.integers(len(OPERATORS)))]
  left_ops = int(rng.integers(num_ops))
  return (op, _random_tree(rng, left_ops, modulus), _random_tree(rng, num_ops - 1 - left_ops,
                                                                   modulus))


def _render(tree) -> str:
  if isinstance(tree, int):
    return str(tree)
  op, left, right = tree
  left_s, right_s = _render(left), _render(right)
  if not isinstance(left, int) and _PRECEDENCE[left[0]] < _PRECEDENCE[op]:
    left_s = f'({left_s})'
  if not isinstance(right, int):
    child = _PRECEDENCE[right[0]]
    if child < _PRECEDENCE[op] or (op == '-' and child == _PRECEDENCE['-']):
      right_s = f'({right_s})'
  return f'{left_s}{op}{right_s}'


def reduce_once(expr: str, modulus: int) -> str:
  """One reduction: in the first innermost parenthesised group (else the whole expression),
  apply the leftmost '*' if any, else the leftmost '+'/'-'; drop parentheses left around a
  single number. Numbers are single digits (modulus <= 10)."""
  chars = list(expr)
  start, end = 0, len(chars)  # the span [start, end) holds no parentheses
  for i, ch in enumerate(chars):
    if ch == '(':
      start = i + 1
    elif ch == ')':
      end = i
      break
  if start > 0 and end == len(chars):
    raise ValueError(f'unbalanced parentheses in {expr!r}')
  span = chars[start:end]
  ops = [i for i, ch in enumerate(span) if ch == '*'] or [
      i for i, ch in enumerate(span) if ch in '+-']
  if not ops:
    raise ValueError(f'nothing to reduce in {expr!r}')
  k = ops[0]
  a, op, b = int(span[k - 1]), span[k], int(span[k + 1])
  value = {'+': a + b, '-': a - b, '*': a * b}[op] % modulus
  span = span[:k - 1] + [str(value)] + span[k + 2:]
  if start > 0 and len(span) == 1:  # '(n)' -> 'n'
    return ''.join(chars[:start - 1] + span + chars[end + 1:])
  return ''.join(chars[:start] + span + chars[end:])


def solve_steps(expr: str, modulus: int) -> list[str]:
  """[expr, step1, ..., answer]: one reduction per step until a single number is left."""
  steps = [expr]
  while len(steps[-1]) > 1:
    steps.append(reduce_once(steps[-1], modulus))
  return steps


@dataclasses.dataclass(frozen=True)
class Problem:
  expression: str
  steps: tuple[str, ...]  # expression first, answer last
  num_ops: int

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
  expr = random_expression(rng, num_ops, modulus)
  return Problem(expr, tuple(solve_steps(expr, modulus)), num_ops)


# ---------------------------------------------------------------------------------------------
# Settings, splits and the training iterator.


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  modulus: int = 7
  train_min_ops: int = 1
  train_max_ops: int = 5
  eval_max_ops: int = 8
  seq_len: int = 128
  seed: int = 0


def settings_from_config(data_config) -> TaskSettings:
  """Reads the task's fields from config.data (ConfigDict or dict), validating them."""
  get = data_config.get
  s = TaskSettings(
      modulus=int(get('arithmetic_modulus', 7)),
      train_min_ops=int(get('arithmetic_train_min_ops', 1)),
      train_max_ops=int(get('arithmetic_train_max_ops', 5)),
      eval_max_ops=int(get('arithmetic_eval_max_ops', 8)),
      seq_len=int(get('seq_len', 128)),
      seed=int(get('seed', 0)),
  )
  if not 2 <= s.modulus <= 10:
    raise ValueError(f'data.arithmetic_modulus={s.modulus}: allowed 2..10 (one character per '
                     'number)')
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
  """Row `row_index` of the infinite training stream: packed `<bos> problem <eos>` sequences of
  training length, cut to seq_len (the cut tail is dropped). int32 [seq_len]."""
  rng = _rng(settings.seed, 'train', row_index)
  tok = ArithmeticTokenizer()
  ids: list[int] = []
  while len(ids) < settings.seq_len:
    n = int(rng.integers(settings.train_min_ops, settings.train_max_ops + 1))
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
  (same contract as bipe_jax.data.make_eval_blocks; 65536 tokens unless max_tokens)."""
  from bipe_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  settings = settings_from_config(data_config)
  stream = eval_stream(settings, split, int(max_tokens or 65536))
  return pipeline.cut_blocks(stream, length, stride, what=f'the arithmetic {split!r} stream')
