"""The benchmarks compiled for TPU by libtpu on this host, at their smallest size (the scripts
and the driver are test_benchmarks_smoke.py's)."""

import pytest

from tests.project.test_benchmarks_smoke import SMOKE, run_group


@pytest.mark.slow
def test_tpu_benchmark_scripts_run_at_their_smallest_size(tmp_path):
  pytest.importorskip('libtpu', reason='the TPU compiler (requirements-tpu.txt) is needed')
  assert {s for s, (g, _) in SMOKE.items() if g == 'tpu'} == {
      'pallas_tpu_memory.py', 'context_parallel_compile.py', 'compile_table.py',
      'tpu_layer_cost.py'}
  run_group('tpu', tmp_path)
