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

from etils import epath

from bipe_jax.state import checkpointing
from bipe_jax.training import config_validation


def saved_data_shards(checkpoint_dir: str) -> Optional[int]:
  """The logical data shard count in the newest checkpoint's data state; None if unknown."""
  steps = checkpointing.step_dirs(checkpoint_dir)
  if not steps:
    return None
  for path in sorted(epath.Path(steps[max(steps)]).glob('*/process_*.json')):
    try:
      state = json.loads(path.read_text()).get('json')
    except (OSError, ValueError):
      continue
    if isinstance(state, dict) and isinstance(state.get('num_shards'), int):
      return state['num_shards']
  return None


def resolve_data_shards(config, data_process_count: int,
                        checkpoint_dir: str) -> tuple[int, Optional[str]]:
  """(logical data shard count, the line to print when it was adopted from the checkpoint).

  Sets config.train.data_shards to an adopted count, so the run's saved config records it."""
  t = config.train
  if not t.data_shards:
    saved = saved_data_shards(checkpoint_dir)
    if (saved and saved != data_process_count and saved % data_process_count == 0
        and t.batch_size % saved == 0):
      t.data_shards = saved
      count = config_validation.validate_data_shards(config, data_process_count)
      return count, (f"train.data_shards={saved}: the checkpoint's data state has {saved} "
                     f'logical data shards; {data_process_count} data-loading process'
                     f'{"es" if data_process_count > 1 else ""} each load {saved // data_process_count}'
                     ' of them, so the data continues exactly')
  return config_validation.validate_data_shards(config, data_process_count), None
