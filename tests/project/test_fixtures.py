"""The shared fixtures' own logic (tests/fixtures.py): the subprocess environment, the tiny model."""

from tests import fixtures


def test_xla_flags_keep_other_flags_and_the_fast_compile_level_and_replace_the_device_count():
  environ = {'XLA_FLAGS': '--xla_dump_to=/x --xla_force_host_platform_device_count=4'}
  fast = ' '.join(fixtures.FAST_COMPILE_FLAGS)
  assert fixtures.xla_flags(8, environ) == (
      f'--xla_dump_to=/x {fast} --xla_force_host_platform_device_count=8')
  assert fixtures.xla_flags(1, environ) == f'--xla_dump_to=/x {fast}'
  mine = {'XLA_FLAGS': '--xla_backend_optimization_level=2'}  # a level set by the caller stays
  assert fixtures.xla_flags(2, mine) == ('--xla_backend_optimization_level=2 '
                                         '--xla_cpu_use_fusion_emitters=false '
                                         '--xla_cpu_parallel_codegen_split_count=1 '
                                         '--xla_force_host_platform_device_count=2')
  assert fixtures.xla_flags(1, {}) == fast


def test_cpu_env_runs_jax_on_cpu_with_the_repository_importable():
  env = fixtures.cpu_env(4, EXTRA='1')
  assert env['JAX_PLATFORMS'] == 'cpu' and env['EXTRA'] == '1'
  assert env['PYTHONPATH'].split(':')[0] == fixtures.ROOT
  assert env['XLA_FLAGS'].endswith('--xla_force_host_platform_device_count=4')


def test_tiny_model_config_defaults_and_overrides():
  cfg = fixtures.tiny_model_config()
  assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.ffn_size) == (
      64, 32, 2, 4, 64)
  assert cfg.position_encoding == 'bipe_rope' and cfg.separator_ids == (3,)
  rope = fixtures.tiny_model_config(position_encoding='rope', num_layers=1)
  assert rope.position_encoding == 'rope' and rope.num_layers == 1 and rope.hidden_size == 32


def test_recorded_seconds_name_the_nodes_pytest_collects(tmp_path):
  """tests/record_test_seconds.py: node ids as pytest writes them, per-file sums, the slow tier."""
  from tests import record_test_seconds as record  # pylint: disable=g-import-not-at-top
  assert record.node_id('tests.model.test_model', 'test_every_scheme[rope]') == (
      'tests/model/test_model.py::test_every_scheme[rope]')
  assert record.node_id('tests.che.test_che.TestGrid', 'test_cell') == (
      'tests/che/test_che.py::TestGrid::test_cell')
  report = tmp_path / 'report.xml'
  report.write_text(
      '<testsuites><testsuite>'
      '<testcase classname="tests.a.test_x" name="test_one" time="2.5"/>'
      '<testcase classname="tests.a.test_x" name="test_two[p]" time="0.25"/>'
      '<testcase classname="tests.b.test_y.TestK" name="test_three" time="0.5"/>'
      '</testsuite></testsuites>', encoding='utf-8')
  assert record.test_seconds(str(report)) == {
      'files': {'tests/a/test_x.py': 2.8, 'tests/b/test_y.py': 0.5},
      'slow': {'tests/a/test_x.py::test_one': 2.5}}
