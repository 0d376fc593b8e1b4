"""A run trained by 2 processes, resumed by 1: train.data_shards=0 adopts the checkpoint's 2
logical data shards (the data continues exactly) and says so in one line; an explicit value
or a count the processes do not divide is left to the restore's own check."""

import json
import os

import ml_collections
import pytest

from bipe_jax.training import data_shards


def _checkpoint(path, step, num_shards, processes):
  """A step folder as the trainer saves it: one data-state file per process."""
  data = os.path.join(path, str(step), 'data')
  os.makedirs(data)
  for p in range(processes):
    shards = {str(s): {'position': s} for s in range(num_shards) if s % processes == p}
    with open(os.path.join(data, f'process_{p}-of-{processes}.json'), 'w',
              encoding='utf-8') as f:
      json.dump({'json': {'num_shards': num_shards, 'shards': shards}}, f)
  return str(path)


def _config(data_shards_value=0, batch_size=8):
  return ml_collections.ConfigDict(
      {'train': {'data_shards': data_shards_value, 'batch_size': batch_size}})


def test_the_newest_checkpoint_s_shard_count_is_read(tmp_path):
  ckpt = _checkpoint(tmp_path, 2, 4, 4)
  _checkpoint(tmp_path, 6, 2, 2)
  assert data_shards.saved_data_shards(ckpt) == 2
  assert data_shards.saved_data_shards(str(tmp_path / 'none')) is None


def test_one_process_adopts_the_two_shards_of_a_two_process_run(tmp_path):
  ckpt = _checkpoint(tmp_path, 4, 2, 2)
  config = _config()
  count, line = data_shards.resolve_data_shards(config.train, 1, ckpt)
  assert count == 2 and config.train.data_shards == 0  # not edited: the trainer records it
  assert line.startswith("train.data_shards=2: the checkpoint's data state has 2 logical data "
                         'shards; 1 data-loading process each load 2')
  assert '\n' not in line


@pytest.mark.parametrize('processes, explicit, batch, expected', [
    (2, 0, 8, 2),  # same process count: nothing to adopt
    (3, 0, 9, 3),  # 3 does not divide 2: the restore refuses with its own line
    (1, 1, 8, 1),  # an explicit value is kept
])
def test_nothing_is_adopted_otherwise(tmp_path, processes, explicit, batch, expected):
  ckpt = _checkpoint(tmp_path, 4, 2, 2)
  config = _config(explicit, batch)
  count, line = data_shards.resolve_data_shards(config.train, processes, ckpt)
  assert (count, line) == (expected, None)


def test_a_fresh_run_keeps_one_shard_per_process(tmp_path):
  assert data_shards.resolve_data_shards(_config().train, 2, str(tmp_path)) == (2, None)
