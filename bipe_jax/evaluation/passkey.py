"""Passkey retrieval: exact-match accuracy of a hidden 5-digit key by context length and depth.

Works on any run:
  * a run of the synthetic task (`data.dataset='passkey'`, bipe_jax/tasks/passkey.py): its own
    samples, `... KEY IS d d d d d . ... ? ANS` -> the 5 digits;
  * any text run: its tokenizer and separators, with the standard probe text (filler
    sentences, "The pass key is NNNNN. Remember it. NNNNN is the pass key." at the depth, then
    "What is the pass key? The pass key is") -> the key's tokens.
Every probe row is exactly `length` tokens. Greedy decoding returns the key exactly when, fed
the true earlier key tokens, the argmax at every key position is the key token (the first
wrong argmax is where greedy decoding would leave the key), so one teacher-forced forward pass
per batch scores it: `key_found`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax import storage
from bipe_jax.tasks import passkey as passkey_task

FILLER_TEXT = ('The grass is green.', 'The sky is blue.', 'The sun is yellow.', 'Here we go.',
               'There and back again.')
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclasses.dataclass(frozen=True)
class Cell:
  length: int
  depth: float
  trials: int
  correct: int

  @property
  def accuracy(self) -> float:
    return self.correct / self.trials

  def to_dict(self) -> dict:
    return dict(length=self.length, depth=self.depth, trials=self.trials, correct=self.correct,
                accuracy=self.accuracy)


def key_found(apply_fn: Callable, params, tokens_NxL: np.ndarray, answer_positions_NxK,
              batch_size: int = 16) -> np.ndarray:
  """bool [N]: whether greedy decoding from each row's prompt (everything before its first
  answer position) yields the answer tokens (the row's tokens at answer_positions)."""
  tokens = np.asarray(tokens_NxL)
  positions = np.asarray(answer_positions_NxK)
  forward = jax.jit(lambda p, x: jnp.argmax(apply_fn(p, x), axis=-1))
  found = []
  for start in range(0, len(tokens), batch_size):
    rows, pos = tokens[start:start + batch_size], positions[start:start + batch_size]
    predicted = np.asarray(forward(params, jnp.asarray(rows)))  # [b, L]: next-token argmax
    guess = np.take_along_axis(predicted, pos - 1, axis=1)
    found.append((guess == np.take_along_axis(rows, pos, axis=1)).all(axis=1))
  return np.concatenate(found)


def synthetic_rows(length: int, depth: float, trials: int, seed: int = 0):
  """(tokens int32 [trials, length], answer positions [trials, 5]) of the synthetic task."""
  rng = np.random.default_rng([seed, 2, length, int(round(depth * 1000))])
  samples = [passkey_task.make_sample(rng, length, depth) for _ in range(trials)]
  return (np.stack([s.ids for s in samples]), np.stack([s.answer_positions for s in samples]))


def text_rows(tokenizer, length: int, depth: float, trials: int, seed: int = 0, bos_id=1):
  """(tokens int32 [trials, length], answer positions [trials, k]) of the standard text probe
  under `tokenizer`: BOS, filler sentences, the needle at `depth`, the question, the key."""
  rng = np.random.default_rng([seed, 3, length, int(round(depth * 1000))])
  encode = lambda text: [int(i) for i in tokenizer.encode(text)]  # pylint: disable=unnecessary-lambda-assignment
  filler = [encode(s) for s in FILLER_TEXT]
  rows, positions = [], []
  for _ in range(trials):
    key = ''.join(str(int(d)) for d in rng.integers(0, 10, 5))
    needle = encode(f'The pass key is {key}. Remember it. {key} is the pass key.')
    question, answer = encode('What is the pass key? The pass key is'), encode(key)
    head = [bos_id] if bos_id >= 0 else []
    budget = length - len(head) - len(needle) - len(question) - len(answer)
    if budget < 0:
      raise ValueError(f'passkey: length {length} is too short for the probe text '
                       f'({length - budget} tokens without filler)')
    sentences, used = [], 0
    while used < budget:
      s = filler[len(sentences) % len(filler)][:budget - used]
      sentences.append(s)
      used += len(s)
    at = int(round(depth * len(sentences)))
    body = [i for s in sentences[:at] for i in s] + needle + [i for s in sentences[at:] for i in s]
    row = head + body + question + answer
    rows.append(row)
    positions.append(np.arange(len(row) - len(answer), len(row)))
  return np.asarray(rows, np.int32), np.stack(positions)


def probe(apply_fn: Callable, params, row_fn: Callable, lengths: Sequence[int],
          depths: Sequence[float] = DEFAULT_DEPTHS, trials: int = 20,
          batch_size: int = 16) -> list[Cell]:
  """Accuracy for every (length, depth); row_fn(length, depth, trials) -> (tokens, positions)."""
  cells = []
  for length in lengths:
    for depth in depths:
      tokens, positions = row_fn(int(length), float(depth), trials)
      found = key_found(apply_fn, params, tokens, positions,
                        batch_size=max(1, batch_size * 512 // max(int(length), 512)))
      cells.append(Cell(int(length), float(depth), trials, int(found.sum())))
  return cells


def row_function(run, seed: int = 0) -> Callable:
  """The probe rows for a run: the synthetic task's, or the text probe with its tokenizer."""
  if run.config.data.dataset == passkey_task.DATASET_NAME:
    return lambda length, depth, trials: synthetic_rows(length, depth, trials, seed)
  from bipe_jax import data  # pylint: disable=g-import-not-at-top
  tokenizer = data.get_tokenizer(run.config.data)
  bos = run.model_config.bos_id
  return lambda length, depth, trials: text_rows(tokenizer, length, depth, trials, seed, bos)


def format_table(results: dict[str, Sequence[Cell]]) -> str:
  """Markdown: one row per (run, length), accuracy per depth, and the mean."""
  depths = sorted({c.depth for cells in results.values() for c in cells})
  lines = ['| run | length | ' + ' | '.join(f'depth {d:g}' for d in depths) + ' | mean |',
           '|---|---:|' + '---:|' * (len(depths) + 1)]
  for label, cells in results.items():
    for length in sorted({c.length for c in cells}):
      row = {c.depth: c for c in cells if c.length == length}
      accs = [row[d].accuracy for d in depths if d in row]
      lines.append(f'| {label} | {length} | ' + ' | '.join(
          f'{row[d].accuracy:.2f}' if d in row else '-' for d in depths)
                   + f' | {np.mean(accs):.2f} |')
  return '\n'.join(lines)


def plot_heatmaps(results: dict[str, Sequence[Cell]], path: str) -> str:
  """One accuracy heat map (length x depth) per run, side by side, into a PNG."""
  from bipe_jax.evaluation import plot  # pylint: disable=g-import-not-at-top  (sets the backend)
  plt = plot.plt
  fig, axes = plt.subplots(1, len(results), figsize=(3.6 * len(results) + 1, 3.4),
                           squeeze=False)
  image = None
  for ax, (label, cells) in zip(axes[0], results.items()):
    lengths = sorted({c.length for c in cells})
    depths = sorted({c.depth for c in cells})
    grid = np.full((len(lengths), len(depths)), np.nan)
    for c in cells:
      grid[lengths.index(c.length), depths.index(c.depth)] = c.accuracy
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap='viridis', aspect='auto', origin='lower')
    ax.set_xticks(range(len(depths)), [f'{d:g}' for d in depths])
    ax.set_yticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_xlabel('depth of the key')
    if ax is axes[0][0]:
      ax.set_ylabel('context length (tokens)')
    ax.set_title(label.replace(' (', '\n('), fontsize=9)
    for i in range(len(lengths)):
      for j in range(len(depths)):
        if not np.isnan(grid[i, j]):
          ax.text(j, i, f'{grid[i, j]:.2f}', ha='center', va='center', fontsize=8,
                  color='white' if grid[i, j] < 0.6 else 'black')
  fig.colorbar(image, ax=axes[0].tolist(), label='exact-match accuracy')
  storage.save_figure(fig, path, dpi=110, bbox_inches='tight')
  plt.close(fig)
  return path
