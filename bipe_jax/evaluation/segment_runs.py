"""Demo runs that differ by their segmentation: run labels 'ENCODING@RULE' and the corpus's mean
segment length (BiPE's fixed-length ablation, `make demo-segments`).

A demo label is an encoding name (`bipe_rope`), or an encoding with a separator rule after '@'
(`bipe_rope@fixed:12`: model.separators='fixed:12'). `fixed:auto` stands for fixed-length
segments of the corpus's mean segment length under the natural rule (`mean_segment_length`),
resolved once the corpus is prepared, so the ablation compares natural segments with
fixed-length ones of the same mean size.
"""

from __future__ import annotations

import numpy as np

AUTO_FIXED = 'fixed:auto'


def split_label(label: str) -> tuple[str, str]:
  """'bipe_rope@fixed:12' -> ('bipe_rope', 'fixed:12'); 'rope' -> ('rope', '')."""
  encoding, _, rule = str(label).partition('@')
  return encoding, rule


def label_dirname(label: str) -> str:
  """A label as a folder name ('bipe_rope@fixed:12' -> 'bipe_rope-fixed12')."""
  return label.replace('@', '-').replace(':', '')


def check_label(label: str, scheme_names) -> None:
  """ValueError naming the label when its encoding or its separator rule is not valid."""
  from bipe_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  encoding, rule = split_label(label)
  if encoding not in scheme_names:
    raise ValueError(f'--encodings: {label!r}: {encoding!r} is not an encoding; allowed: '
                     f'{", ".join(scheme_names)}')
  if not rule or rule == AUTO_FIXED:
    return
  if rule not in config_lib.SEPARATOR_MODES[:-1]:  # every rule but 'ids' (needs the ids)
    config_lib.fixed_segment_length(rule)  # raises on 'fixed:x'
    if not rule.startswith(config_lib.FIXED_PREFIX):
      raise ValueError(f'--encodings: {label!r}: the rule after @ must be one of '
                       f'{config_lib.SEPARATOR_MODES[:-1]}, fixed:K or {AUTO_FIXED}')


def mean_segment_length(tokens: np.ndarray, separator_ids) -> float:
  """Mean segment length (tokens per segment) of a token stream [N] or rows [N, L] read as one
  stream: tokens / separators (a segment ends at each separator)."""
  tokens = np.asarray(tokens).reshape(-1)
  seps = int(np.isin(tokens, np.asarray(list(separator_ids), dtype=tokens.dtype)).sum())
  if seps == 0:
    raise ValueError(f'no separator among {tokens.size} tokens: no mean segment length')
  return tokens.size / seps


def corpus_mean_segment_length(data_config, rule: str = 'sentence',
                               max_tokens: int = 1 << 20) -> float:
  """mean_segment_length of the first `max_tokens` tokens of the training split under the
  tokenizer's separator `rule` (the corpus and tokenizer must be prepared)."""
  from bipe_jax import data  # pylint: disable=g-import-not-at-top
  tokens = data.eval_stream(data_config, 'train')[:max_tokens]
  return mean_segment_length(tokens, data.get_tokenizer(data_config).separator_ids(rule))


def resolve_auto(labels, k: int) -> tuple[str, ...]:
  """Labels with '@fixed:auto' replaced by '@fixed:K'."""
  return tuple(l.replace('@' + AUTO_FIXED, f'@fixed:{k}') for l in labels)
