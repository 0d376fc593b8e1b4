"""Benchmark results record the machine's load and are not written when it was not quiet."""

import json

import pytest

from benchmarks import common
from benchmarks import core_parallelism


def test_disturbance_rules():
  assert common.disturbance(0.5, 2.5, max_load=2.0, own_cores=2) == ''
  assert 'at the start' in common.disturbance(2.4, 2.5, max_load=2.0, own_cores=2)
  assert 'at the end' in common.disturbance(1.0, 4.5, max_load=2.0, own_cores=2)
  both = common.disturbance(9.0, 9.0, max_load=2.0, own_cores=2)
  assert 'at the start' in both and 'at the end' in both


def test_quiet_result_is_written_with_its_load(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(common, 'LOAD_AT_START', 0.4)
  monkeypatch.setattr(common, 'load_average', lambda: 1.9)
  out = str(tmp_path / 'r')
  text = common.report('speed', '| a |\n|---|\n| 1 |', ['note'], out=out, data={'x': 1})
  assert 'DISTURBED' not in text
  assert 'Load average (1 min): 0.40 at the start, 1.90 at the end' in text
  with open(out + '.md') as f:
    assert f.read() == text + '\n'
  with open(out + '.json') as f:
    saved = json.load(f)
  assert saved['load_average'] == [0.4, 1.9] and saved['data'] == {'x': 1}
  capsys.readouterr()


def test_disturbed_result_is_marked_and_not_written(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(common, 'LOAD_AT_START', 6.0)
  monkeypatch.setattr(common, 'load_average', lambda: 7.0)
  out = str(tmp_path / 'r')
  text = common.report('speed', '| a |\n|---|\n| 1 |', out=out, data={'x': 1})
  assert text.startswith('### DISTURBED (load 6.00 > 2 at the start')
  assert not (tmp_path / 'r.md').exists() and not (tmp_path / 'r.json').exists()
  assert 'not written' in capsys.readouterr().err


def test_parallel_efficiency_is_the_concurrent_sum_over_cores_times_the_rate_alone():
  assert core_parallelism.parallel_efficiency(100.0, [100.0, 100.0]) == 1.0
  assert core_parallelism.parallel_efficiency(180.0, [45.0, 45.0]) == 0.25
  with pytest.raises(ValueError, match='positive rate'):
    core_parallelism.parallel_efficiency(0.0, [1.0])
