"""Segment statistics of a run's training data, and the RoPE-scaling length they define.

For `bipe_rope` the rotary positions are segment indices (the inter stream), so the "original
length" of a RoPE scaling method (YaRN, PI, NTK) is the number of segments a training row
holds, not its number of tokens: a model trained on rows of 1024 tokens with ~40 sentences per
row has seen inter positions 0..~40 only. A fresh run of a bipe_* scheme measures the inter
positions of its training rows (`measure`: `ROWS` rows of the training pipeline, a separate
iterator, so the run's own data order is untouched) and writes them to
`<workdir>/position_stats.json` (max, 99th percentile, mean of the last inter position of a
row, at data.seq_len).

`model.rope_original_length` = 0 for a scheme that rotates by the inter stream, with a RoPE
scaling, is resolved once at start (`inter_original_length`), in this order:
  1. the value recorded in the workdir's config.json (a resumed run);
  2. the `position_stats.json` of the `train.init_from` workdir (fine-tuning: the source's
     training is what the scaling extends): its max + 1;
  3. the run's own training rows: max + 1.
The max (not the 99th percentile) is used, as YaRN uses the training context length: every
position seen in training stays inside the original range. Both are recorded.
"""

from __future__ import annotations

import functools
import json
import os

import jax
import numpy as np

from bipe_jax import positions as positions_lib
from bipe_jax.runs import restore
from bipe_jax.runs import run_record

STATS_FILE = 'position_stats.json'
ROWS = 64


def inter_stats(model_config, tokens_NxL) -> dict:
  """Inter-position statistics of rows [N, L] under the model's separators (and BOS / pad)."""
  tokens = np.asarray(tokens_NxL)
  sep = positions_lib.separator_table(model_config.vocab_size, model_config.separator_ids)
  docs = (positions_lib.separator_table(model_config.vocab_size, (model_config.bos_id,))
          if model_config.bos_id >= 0 else None)
  streams = jax.jit(functools.partial(  # one compile, not one per eager op (~2 s on a CPU)
      positions_lib.bilevel_positions,
      pad_id=model_config.pad_id if model_config.pad_id >= 0 else None,
      restart_at_documents=model_config.restart_at_documents,
      fixed_segment_length=model_config.fixed_segment_length))
  inter = np.asarray(streams(tokens, sep, document_start_table_V=docs).inter)
  row_max = inter.max(axis=1)
  return {'length': int(tokens.shape[1]), 'rows': int(tokens.shape[0]),
          'max_inter': int(row_max.max()), 'p99_inter': float(np.percentile(row_max, 99)),
          'mean_last_inter': float(row_max.mean()),
          'mean_segment_tokens': float(tokens.shape[1] / (row_max.mean() + 1))}


def measure(data_config, model_config, make_iterator, rows: int = ROWS) -> dict:
  """inter_stats of the first `rows` rows of a fresh training iterator."""
  batch = next(iter(make_iterator(data_config, rows, 0, 1)))
  return inter_stats(model_config, batch['tokens'])


def write(workdir: str, stats: dict) -> None:
  run_record.write_text_atomic(os.path.join(workdir, STATS_FILE), json.dumps(stats, indent=2))


def read(workdir: str) -> dict | None:
  return run_record.read_json(os.path.join(workdir, STATS_FILE))


def needs_inter_original_length(model_fields) -> bool:
  """True for a scheme rotating by the inter stream, with a scaling and no original length."""
  from bipe_jax import schemes  # pylint: disable=g-import-not-at-top
  return (schemes.get_scheme(model_fields['position_encoding']).rotary == 'inter'
          and model_fields['rope_scaling'] != 'none'
          and int(model_fields['rope_original_length']) == 0)


def inter_original_length(workdir: str, init_from: str, own_stats) -> tuple[int, str]:
  """(an inter-stream rotary scaling's original length, in segments; where it came from), in
  the order of the module docstring. `own_stats`: a callable returning this run's own stats
  (called only when needed). Reads files; edits nothing (the caller passes the length to
  bipe_jax.training.resolve.resolve)."""
  saved = os.path.join(workdir, 'config.json')
  record = run_record.read_json(saved)
  if record is not None:
    recorded = int(record.get('model', {}).get('rope_original_length', 0))
    if recorded:
      return recorded, f'{recorded} (recorded in {saved})'
  if init_from:
    source, _ = restore.parse_source(init_from)
    stats = read(source)
    if stats is not None:
      length = int(stats['max_inter']) + 1
      return length, (f'{length} segments (max inter position {stats["max_inter"]} + 1 of the '
                      f'training rows of {source}, length {stats["length"]})')
  stats = own_stats()
  length = int(stats['max_inter']) + 1
  return length, (f'{length} segments (max inter position {stats["max_inter"]} + 1 of this '
                  f'run\'s training rows, length {stats["length"]})')
