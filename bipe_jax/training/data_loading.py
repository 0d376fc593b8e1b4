"""This process's share of the global batch, as a concatenation of logical data shards.

The global batch of `B` rows is the concatenation, in shard order, of `S` logical shards
(`train.data_shards`), each a pipeline `make_iterator(data_config, B // S, shard, S)`. A
process reads the consecutive shards of its slice of the batch (mesh.process_data_shard), so
for a fixed S the global batches are identical whatever the number of processes: a
2-process run reproduces a 1-process run, and a checkpoint (whose data state holds every
shard's iterator state) resumes on another process count.
"""

from typing import Callable

import numpy as np


class ShardedDataLoader:
  """Iterator of {'tokens': int32 [B // P, T], 'loss_mask'?: bool [B // P, T]} for this
  process (P = data processes); 'loss_mask' when the pipeline yields one."""

  def __init__(self, make_iterator: Callable, data_config, *, global_batch_size: int,
               num_shards: int, process_slice: tuple[int, int]):
    index, count = process_slice
    if num_shards % count or global_batch_size % num_shards:
      raise ValueError(
          f'train.data_shards={num_shards} must be a multiple of the {count} data-loading '
          f'processes and divide train.batch_size={global_batch_size}')
    per_process = num_shards // count
    self.num_shards = num_shards
    self.shard_ids = tuple(range(index * per_process, (index + 1) * per_process))
    rows = global_batch_size // num_shards
    self._iterators = {s: make_iterator(data_config, rows, s, num_shards)
                       for s in self.shard_ids}

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    parts = [next(self._iterators[s]) for s in self.shard_ids]
    out = {'tokens': np.concatenate([np.asarray(p['tokens'], np.int32) for p in parts])}
    if all('loss_mask' in p for p in parts):
      out['loss_mask'] = np.concatenate([np.asarray(p['loss_mask'], bool) for p in parts])
    return out

  def get_state(self) -> dict:
    """{'num_shards': S, 'shards': {'<shard>': iterator state}} for this process's shards."""
    return {'num_shards': self.num_shards,
            'shards': {str(s): self._iterators[s].get_state() for s in self.shard_ids}}

  def set_state(self, state: dict) -> None:
    """Restores this process's shards from a (possibly merged, all-process) state."""
    if state.get('num_shards') != self.num_shards:
      raise ValueError(
          f"the checkpoint's data state has {state.get('num_shards')} logical data shards but "
          f'this run has train.data_shards={self.num_shards} (0 = the process count); resume '
          f'with the same train.data_shards')
    missing = [s for s in self.shard_ids if str(s) not in state['shards']]
    if missing:
      raise ValueError(f'the checkpoint has no data state for shards {missing}')
    for s in self.shard_ids:
      self._iterators[s].set_state(state['shards'][str(s)])
