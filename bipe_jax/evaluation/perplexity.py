"""Perplexity tables of evaluation results; the scoring itself is bipe_jax/block_scoring.py
(shared with the trainer's validation), re-exported here for evaluation's callers."""

from __future__ import annotations

from typing import Sequence

from bipe_jax.block_scoring import LengthResult
from bipe_jax.block_scoring import block_nll  # pylint: disable=unused-import
from bipe_jax.block_scoring import make_batch_scorer  # pylint: disable=unused-import
from bipe_jax.block_scoring import score_blocks  # pylint: disable=unused-import


def format_table(results: dict[str, Sequence[LengthResult]]) -> str:
  """Text table. One run: length / blocks / tokens scored / NLL / perplexity. Several runs (a
  dict label -> results): one perplexity column per run, side by side."""
  if len(results) == 1:
    (label, rows), = results.items()
    lines = [f'{label}', f'{"length":>8} {"blocks":>7} {"tokens":>9} {"NLL":>8} {"perplexity":>11}']
    for r in rows:
      lines.append(f'{r.length:>8d} {r.blocks:>7d} {r.tokens:>9d} {r.nll:>8.4f} '
                   f'{r.perplexity:>11.3f}')
    return '\n'.join(lines)
  labels = list(results)
  lengths = sorted({r.length for rows in results.values() for r in rows})
  width = max(11, *(len(l) for l in labels))
  by = {lab: {r.length: r for r in rows} for lab, rows in results.items()}
  lines = [f'{"length":>8} {"tokens":>9} ' + ' '.join(f'{l:>{width}}' for l in labels)]
  for n in lengths:
    tokens = next((by[l][n].tokens for l in labels if n in by[l]), 0)
    cells = [f'{by[l][n].perplexity:>{width}.3f}' if n in by[l] else f'{"-":>{width}}'
             for l in labels]
    lines.append(f'{n:>8d} {tokens:>9d} ' + ' '.join(cells))
  return '\n'.join(lines)


def format_markdown(results: dict[str, Sequence[LengthResult]]) -> str:
  """Markdown table of perplexity, one column per run (the README's format)."""
  labels = list(results)
  lengths = sorted({r.length for rows in results.values() for r in rows})
  by = {lab: {r.length: r for r in rows} for lab, rows in results.items()}
  lines = ['| length | tokens scored | ' + ' | '.join(labels) + ' |',
           '|---:|---:|' + '---:|' * len(labels)]
  for n in lengths:
    tokens = next((by[l][n].tokens for l in labels if n in by[l]), 0)
    cells = [f'{by[l][n].perplexity:.2f}' if n in by[l] else '-' for l in labels]
    lines.append(f'| {n} | {tokens} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)
