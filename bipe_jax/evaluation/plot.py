"""PNG plot of perplexity against evaluation length: log axes, one line per run."""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib

from bipe_jax import storage

matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import matplotlib.ticker  # noqa: E402


def number_formatter(values: Sequence[float]):
  """Tick label function for perplexities spanning `values`: as many significant digits as
  the range needs for neighbouring ticks to read differently (815.2, 815.4 rather than 815, 815),
  thousands separated, never fewer than 3."""
  low, high = min(values), max(values)
  relative_span = (high - low) / max(high, 1e-9)
  digits = 3 if relative_span <= 0 else max(3, 2 + math.ceil(-math.log10(relative_span)))

  def label(v: float, _=None) -> str:
    if v <= 0:
      return f'{v:g}'
    decimals = max(0, digits - 1 - math.floor(math.log10(v)))
    return f'{v:,.{decimals}f}'
  return label


def plot_perplexity(runs: dict[str, tuple[Sequence[int], Sequence[float]]], path: str, *,
                    train_length: int | None = None, title: str = 'Perplexity vs length') -> str:
  """Draws `runs` (label -> (lengths, perplexities)) on log-log axes and saves a PNG at `path`.

  A dashed vertical line marks the training length when given. Returns the path.
  """
  if not runs:
    raise ValueError('plot_perplexity: no runs to plot')
  fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
  for label, (lengths, ppl) in runs.items():
    if len(lengths) != len(ppl) or not lengths:
      raise ValueError(f'run {label!r}: {len(lengths)} lengths and {len(ppl)} perplexities')
    ax.plot(list(lengths), list(ppl), marker='o', label=label)
  ax.set_xscale('log', base=2)
  ax.set_yscale('log')
  if train_length:
    ax.axvline(train_length, color='gray', linestyle='--', linewidth=1)
    ax.annotate('train length', (train_length, 0.98), xycoords=('data', 'axes fraction'),
                rotation=90, va='top', ha='right', fontsize=8, color='gray')
  all_lengths = sorted({int(n) for lengths, _ in runs.values() for n in lengths})
  ax.set_xticks(all_lengths)
  ax.set_xticklabels([str(n) for n in all_lengths])
  values = [float(v) for _, ppl in runs.values() for v in ppl]
  _number = number_formatter(values)
  ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_number))
  decades = math.log10(max(values) / max(min(values), 1e-9))
  keep = '123456789' if decades < 0.5 else ('235' if decades < 2 else '')
  ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
      lambda v, _: _number(v) if f'{v:e}'[0] in keep else ''))
  ax.tick_params(axis='y', which='minor', labelsize=7)
  ax.set_xlabel('evaluation length (tokens)')
  ax.set_ylabel('perplexity')
  ax.set_title(title)
  ax.grid(True, which='both', alpha=0.3)
  ax.legend()
  fig.tight_layout()
  storage.save_figure(fig, path)
  plt.close(fig)
  return path
