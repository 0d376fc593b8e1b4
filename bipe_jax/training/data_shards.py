"""How many logical data shards a run loads: train.data_shards, or on resume the checkpoint's.

train.data_shards=0 means "one per data-loading process". A run trained by 2 processes saved
the data state of 2 logical shards; resumed by 1 process, 0 would mean 1 shard and the saved
state would not fit. When the process count divides the checkpoint's shard count (and the
batch divides into it), the resumed run adopts the checkpoint's count, which continues the data
exactly, and says so in one line; an explicit train.data_shards is always kept (and checked
against the checkpoint on restore).
"""

from __future__ import annotations

import json
from typing import Optional

from bipe_jax import storage
from bipe_jax.run_config import require
from bipe_jax.state import checkpointing


def saved_data_shards(checkpoint_dir: str) -> Optional[int]:
  """The logical data shard count in the newest checkpoint's data state; None if unknown."""
  steps = checkpointing.step_dirs(checkpoint_dir)
  if not steps:
    return None
  for path in storage.glob(steps[max(steps)], '*/process_*.json'):
    try:
      state = json.loads(storage.read_bytes(path)).get('json')
    except (OSError, ValueError):
      continue
    if isinstance(state, dict) and isinstance(state.get('num_shards'), int):
      return state['num_shards']
  return None


def resolve_data_shards(train, data_process_count: int,
                        checkpoint_dir: str) -> tuple[int, Optional[str]]:
  """(logical data shard count, the line to print when it was adopted from the checkpoint).

  `train`: the train section (TrainConfig or config.train), not edited: the caller records an
  adopted count (training/resolve.py's `data_shards`); a line is returned only then."""
  if not train.data_shards:
    saved = saved_data_shards(checkpoint_dir)
    if (saved and saved != data_process_count and saved % data_process_count == 0
        and train.batch_size % saved == 0):
      count = validate_data_shards(saved, train.batch_size, data_process_count)
      return count, (f"train.data_shards={saved}: the checkpoint's data state has {saved} "
                     f'logical data shards; {data_process_count} data-loading process'
                     f'{"es" if data_process_count > 1 else ""} each load {saved // data_process_count}'
                     ' of them, so the data continues exactly')
  return validate_data_shards(train.data_shards, train.batch_size, data_process_count), None


def validate_data_shards(data_shards: int, batch_size: int, data_process_count: int) -> int:
  """Checks train.data_shards against the data-loading processes and the global batch; returns
  the shard count (0: one per process). ConfigError (one line) otherwise."""
  count = data_shards or data_process_count
  require(count % data_process_count == 0, 'train.data_shards', data_shards,
          f'must be a multiple of the {data_process_count} data-loading processes (or 0)')
  require(batch_size % count == 0, 'train.batch_size', batch_size,
          f'must be a multiple of the logical data shards train.data_shards={count}')
  return count
