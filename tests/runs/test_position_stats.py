"""Segment statistics of the training rows, and YaRN / PI / NTK on BiPE-RoPE's inter stream in
segment units: recorded by a run, used by the runs fine-tuned from it."""

import json
import os

import numpy as np
import pytest

from bipe_jax import config as model_config_lib
from bipe_jax.encodings import rope
from bipe_jax.runs import position_stats
from configs import base
from tests.fixtures import run_cli


def _model_config(**fields):
  values = dict(vocab_size=16, hidden_size=16, num_layers=1, num_heads=2, ffn_size=16,
                position_encoding='bipe_rope', separators='ids', separator_ids=(3,), bos_id=1)
  values.update(fields)
  return model_config_lib.model_config_from_dict(values)


def test_inter_stats_by_hand():
  rows = np.array([[5, 3, 5, 5, 3, 5, 3, 5],    # inter 0 0 1 1 1 2 2 3: last 3
                   [5, 5, 5, 5, 5, 5, 5, 3]])   # one segment: last 0
  stats = position_stats.inter_stats(_model_config(), rows)
  assert stats == {'length': 8, 'rows': 2, 'max_inter': 3, 'p99_inter': pytest.approx(2.97),
                   'mean_last_inter': 1.5, 'mean_segment_tokens': pytest.approx(8 / 2.5)}


def test_which_configs_need_a_segment_length():
  config = base.get_base_config().model
  config.position_encoding, config.rope_scaling = 'bipe_rope', 'yarn'
  assert position_stats.needs_inter_original_length(config)
  config.rope_original_length = 12
  assert not position_stats.needs_inter_original_length(config)
  config.rope_original_length, config.position_encoding = 0, 'rope'
  assert not position_stats.needs_inter_original_length(config)  # token units: data.seq_len
  config.position_encoding, config.rope_scaling = 'bipe_rope', 'none'
  assert not position_stats.needs_inter_original_length(config)


def test_resolution_order(tmp_path):
  source, workdir = str(tmp_path / 'source'), str(tmp_path / 'run')
  position_stats.write(source, {'max_inter': 9, 'length': 128})
  own = {'max_inter': 4, 'length': 256}

  length, source_line = position_stats.inter_original_length(workdir, '', lambda: own)
  assert (length, source_line.startswith("5 segments (max inter position 4 + 1 of this run's")
          ) == (5, True)
  length, source_line = position_stats.inter_original_length(workdir, f'{source}@40',
                                                             lambda: own)
  assert length == 10 and '10 segments' in source_line
  os.makedirs(workdir)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump({'model': {'rope_original_length': 7}}, f)
  length, source_line = position_stats.inter_original_length(workdir, source, lambda: own)
  assert length == 7 and source_line.startswith('7 (recorded in')


def test_yarn_in_segment_units_keeps_the_fast_dimensions():
  """YaRN's promise: dimensions that rotate >= beta_fast times over the original length are not
  interpolated, dimensions that rotate < beta_slow times are divided by the factor. With the
  original length in segments (here 300; rows of a few dozen segments keep no dimension
  unscaled at all), that split is made on segment indices."""
  head_dim, factor, length = 64, 4.0, 300
  plain = rope.rope_inv_frequencies(head_dim)
  yarn = rope.rope_inv_frequencies(head_dim, scaling='yarn', factor=factor,
                                   original_length=length)
  rotations = length * plain / (2 * np.pi)
  fast, slow = rotations >= 32, rotations < 1
  assert fast.any() and slow.any()
  np.testing.assert_allclose(yarn[fast], plain[fast], rtol=1e-6)
  np.testing.assert_allclose(yarn[slow], plain[slow] / factor, rtol=1e-6)
  # Read in token units (a row of 4096 tokens) the split would be elsewhere: fewer
  # dimensions interpolated.
  tokens = rope.rope_inv_frequencies(head_dim, scaling='yarn', factor=factor,
                                     original_length=4096)
  assert (np.isclose(tokens, plain)).sum() > (np.isclose(yarn, plain)).sum()


SHORT = ('--config.train.steps=2', '--config.checkpoint.every_steps=2',
         '--config.checkpoint.async_save=False')


@pytest.mark.slow
def test_a_bipe_run_records_its_segments_and_a_yarn_fine_tune_uses_them(dirs, trained_run,
                                                                        tmp_path):
  source = trained_run  # the session's bipe_rope run (tests/fixtures.py)
  stats = position_stats.read(source)
  with open(os.path.join(source, 'config.json')) as f:
    trained = json.load(f)
  assert stats['length'] == trained['data']['seq_len'] and stats['rows'] == position_stats.ROWS
  assert 0 < stats['max_inter'] < stats['length'] and stats['p99_inter'] <= stats['max_inter']
  tuned = str(tmp_path / 'yarn')
  proc = run_cli(dirs, tuned, *SHORT, f'--config.train.init_from={source}',
                 '--config.model.rope_scaling=yarn', '--config.model.rope_scaling_factor=4.0',
                 f'--config.data.seq_len={2 * trained["data"]["seq_len"]}')
  want = stats['max_inter'] + 1
  assert f'model.rope_original_length = {want} segments' in proc.stdout
  with open(os.path.join(tuned, 'config.json')) as f:
    assert json.load(f)['model']['rope_original_length'] == want
  # Resuming keeps the recorded value (no second measurement, no resume mismatch).
  proc = run_cli(dirs, tuned, '--config.train.steps=4', '--config.checkpoint.every_steps=2',
                 '--config.checkpoint.async_save=False', f'--config.train.init_from={source}',
                 '--config.model.rope_scaling=yarn', '--config.model.rope_scaling_factor=4.0',
                 f'--config.data.seq_len={2 * trained["data"]["seq_len"]}')
  assert f'model.rope_original_length = {want} (recorded in' in proc.stdout
