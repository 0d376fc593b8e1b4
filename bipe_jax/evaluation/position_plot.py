"""Loss against token position inside the window: the curve extrapolation papers plot to show
where an encoding breaks (past the training length the loss of a failing encoding rises).

`binned_position_loss` averages the per-position sums of `score_blocks(..., per_position=True)`
over log-spaced position bins (position t's loss has few samples at long lengths, so single
positions are noisy); `plot_position_loss` draws one curve per run on a log position axis.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bipe_jax import storage


def binned_position_loss(nll_sum_L: Sequence[float], tokens_L: Sequence[int],
                         bins_per_octave: int = 4) -> tuple[np.ndarray, np.ndarray]:
  """(bin centre positions [M], mean NLL [M]) over log-spaced bins of positions 1..L-1.

  Each bin's mean is its summed NLL over its scored targets (count-weighted); bins with no
  scored target are dropped. Position 0 (never a target) is skipped.
  """
  nll = np.asarray(nll_sum_L, np.float64)
  count = np.asarray(tokens_L, np.float64)
  if nll.shape != count.shape or nll.ndim != 1:
    raise ValueError(f'per-position sums {nll.shape} and counts {count.shape} must be [L]')
  length = nll.shape[0]
  if length < 2:
    raise ValueError(f'a window of {length} positions has no target')
  edges = np.unique(np.floor(2.0 ** (np.arange(0, np.log2(length) * bins_per_octave + 1)
                                     / bins_per_octave)).astype(int))
  edges = np.concatenate([edges[edges < length], [length]])
  centres, means = [], []
  for lo, hi in zip(edges[:-1], edges[1:]):
    c = count[lo:hi].sum()
    if c > 0:
      centres.append(np.sqrt(lo * (hi - 1)) if hi - 1 > lo else float(lo))
      means.append(nll[lo:hi].sum() / c)
  return np.asarray(centres), np.asarray(means)


def plot_position_loss(curves: dict[str, tuple[Sequence[float], Sequence[int]]], path: str, *,
                       train_length: int | None = None, title: str = '') -> str:
  """Draws label -> (per-position NLL sums [L], counts [L]) binned on a log position axis and
  saves a PNG at `path`; a dashed line marks the training length. Returns the path."""
  from bipe_jax.evaluation import plot  # pylint: disable=g-import-not-at-top (sets Agg)
  plt = plot.plt
  if not curves:
    raise ValueError('plot_position_loss: no curves to plot')
  fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
  for label, (nll_sum, tokens) in curves.items():
    x, y = binned_position_loss(nll_sum, tokens)
    ax.plot(x, y, marker='.', label=label)
  ax.set_xscale('log', base=2)
  if train_length:
    ax.axvline(train_length, color='gray', linestyle='--', linewidth=1)
    ax.annotate('train length', (train_length, 0.98), xycoords=('data', 'axes fraction'),
                rotation=90, va='top', ha='right', fontsize=8, color='gray')
  ax.set_xlabel('token position in the window (log scale)')
  ax.set_ylabel('mean loss (nats per token)')
  ax.set_title(title or 'Loss by token position')
  ax.grid(True, which='both', alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  storage.save_figure(fig, path)
  plt.close(fig)
  return path


def plot_document_positions(document: dict, path: str) -> str:
  """The per-position PNG of a results document (sweep.results_document with per-position
  results): for each run, its curve at the longest length scored per position."""
  curves, train_lengths = {}, set()
  for entry in document['runs']:
    scored = [r for r in entry['results'] if 'position_nll' in r]
    if not scored:
      continue
    longest = max(scored, key=lambda r: r['length'])
    sums = [(m or 0.0) * c for m, c in zip(longest['position_nll'], longest['position_tokens'])]
    curves[f'{entry["label"]} ({longest["length"]})'] = (sums, longest['position_tokens'])
    train_lengths.add(entry.get('train_length'))
  if not curves:
    raise ValueError('no run of the document was scored per position (--per_position)')
  train_length = train_lengths.pop() if len(train_lengths) == 1 else None
  title = f'Loss by position, protocol {document.get("protocol", "windows")}'
  return plot_position_loss(curves, path, train_length=train_length, title=title)
