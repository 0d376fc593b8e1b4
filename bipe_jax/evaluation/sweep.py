"""Perplexity of restored runs at several evaluation lengths, and the results file.

Every length scores the same validation stream (capped once with `max_tokens`), cut into
windows by a protocol (bipe_jax/evaluation/protocols.py): non-overlapping windows, every target
scored ('windows' = 'blocks', the official one), only their last K ('last:K', DAPE's), or
sliding windows scoring only their last STRIDE tokens ('sliding:STRIDE', or 'sliding' with
`stride`). With `per_position`, each result also holds the loss at every window position.
"""

from __future__ import annotations

import datetime
import platform
from typing import Callable, Sequence

import jax
import numpy as np

from bipe_jax import storage
from bipe_jax.evaluation import perplexity as ppl
from bipe_jax.evaluation import protocols as protocols_lib
from bipe_jax.runs import restore as runs_lib

PROTOCOLS = ('blocks', 'windows', 'last:K', 'sliding:STRIDE', 'sliding')  # see protocols.py


def parse_lengths(text: str) -> list[int]:
  """'128,256,512' -> [128, 256, 512]; ValueError naming the bad entry."""
  out = []
  for part in str(text).split(','):
    part = part.strip()
    if not part:
      continue
    if not part.isdigit() or int(part) < 2:
      raise ValueError(f'--lengths: {part!r} is not an integer >= 2 (e.g. --lengths=128,256,512)')
    out.append(int(part))
  if not out:
    raise ValueError('--lengths is empty (e.g. --lengths=128,256,512)')
  return sorted(set(out))


def check_protocol(protocol: str, stride: int | None) -> protocols_lib.Protocol:
  """The parsed protocol; ValueError naming a bad one (e.g. 'sliding' without --stride)."""
  if protocol == 'sliding' and not (stride and stride > 0):
    raise ValueError('--protocol=sliding needs --stride > 0 (tokens scored per window), or '
                     'write --protocol=sliding:STRIDE')
  return protocols_lib.parse(protocol, stride)


def eval_blocks(data_config, length: int, *, protocol: str = 'blocks', stride: int | None = None,
                max_tokens: int | None = None):
  """(tokens [N, length], target_mask [N, length]) from the data pipeline's validation split,
  the targets those the protocol scores."""
  from bipe_jax import data  # pylint: disable=g-import-not-at-top
  parsed = check_protocol(protocol, stride)
  parsed.check_length(length)
  tokens, mask = data.make_eval_blocks(data_config, length, split='validation',
                                       max_tokens=max_tokens, stride=protocols_lib.stride(parsed))
  return tokens, protocols_lib.restrict_targets(mask, parsed)


def common_targets(mask_NxL: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
  """The target mask of non-overlapping blocks of one length, restricted to the targets that
  are targets at every length of the sweep.

  Blocks of length L cut the stream (a multiple of the longest length) at multiples of L, and a
  block's first token has no context inside the block, so it is not scored: each length would
  score a slightly different set of tokens. Scoring at every length only the stream positions
  that are a multiple of none of the lengths makes the sets identical (for the usual 1x, 2x, 4x,
  ... sweep: every position that is not a multiple of the shortest length), so the perplexities
  of a sweep differ only by the context the model sees.
  """
  n, length = mask_NxL.shape
  position = np.arange(n)[:, None] * length + np.arange(length)[None, :]
  keep = np.ones_like(mask_NxL, dtype=bool)
  for other in lengths:
    keep &= position % int(other) != 0
  return mask_NxL & keep


def evaluate_run(run: runs_lib.Run, lengths: Sequence[int], *, protocol: str = 'blocks',
                 stride: int | None = None, max_tokens: int | None = None,
                 tokens_per_batch: int = 16384, data_config=None,
                 progress_factory: Callable[[int, int], Callable[[int], None]] | None = None,
                 on_result: Callable[[ppl.LengthResult], None] | None = None,
                 per_position: bool = False) -> list[ppl.LengthResult]:
  """LengthResult per length for one restored run.

  data_config: the validation data (default: the run's own config.data). progress_factory:
  (length, num_blocks) -> progress callback; on_result is called after each length.
  per_position: also score the mean loss at each window position (LengthResult.position_nll).
  """
  data_config = data_config if data_config is not None else run.config.data
  apply_fn = run.apply_fn()
  results = []
  common = check_protocol(protocol, stride).same_targets_at_every_length
  if common:  # one stream, a multiple of the longest length, for every length
    longest, _ = eval_blocks(data_config, max(lengths), max_tokens=max_tokens)
    max_tokens = longest.size
  with run.context():
    for length in lengths:
      tokens, mask = eval_blocks(data_config, length, protocol=protocol, stride=stride,
                                 max_tokens=max_tokens)
      if common:
        mask = common_targets(mask, lengths)
      progress = progress_factory(length, tokens.shape[0]) if progress_factory else None
      result = ppl.score_blocks(apply_fn, run.params, tokens, mask,
                                batch_size=max(1, tokens_per_batch // length), mesh=run.mesh,
                                progress=progress, per_position=per_position)
      results.append(result)
      if on_result:
        on_result(result)
  return results


def results_document(entries: Sequence[dict], *, protocol: str, stride: int | None,
                     max_tokens: int | None, command: str = '') -> dict:
  """The JSON written by the CLI and the demo: runs with their per-length results + context."""
  return {
      'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
      'command': command,
      'protocol': protocol,
      'stride': stride,
      'max_tokens': max_tokens,
      'host': {'platform': platform.platform(), 'devices': [str(d) for d in jax.devices()],
               'jax': jax.__version__},
      'runs': list(entries),
  }


def run_entry(label: str, run: runs_lib.Run, results: Sequence[ppl.LengthResult]) -> dict:
  return {'label': label, 'workdir': storage.absolute(run.workdir), 'encoding': run.encoding,
          'step': run.step, 'train_length': run.train_length,
          'results': [r.to_dict() for r in results]}


def write_json(document: dict, path: str) -> str:
  return storage.write_json(path, document)


def plot_document(document: dict, path: str) -> str:
  """The PNG of a results document: one line per run."""
  from bipe_jax.evaluation import plot  # pylint: disable=g-import-not-at-top
  runs = {e['label']: ([r['length'] for r in e['results']], [r['perplexity'] for r in e['results']])
          for e in document['runs']}
  train_lengths = {e['train_length'] for e in document['runs']}
  train_length = train_lengths.pop() if len(train_lengths) == 1 else None
  title = 'Perplexity vs evaluation length'
  if train_length:
    title += f' (trained at {train_length} tokens)'
  return plot.plot_perplexity(runs, path, train_length=train_length, title=title)
