"""`--cpu_devices`: a CPU host split into single-threaded JAX devices (set before JAX starts)."""

import os
import subprocess
import sys

import pytest

from bipe_jax.kernels import cpu_devices
from tests import fixtures
from tests import forkserver

ROOT = fixtures.ROOT


def test_single_thread_settings_are_added_once_and_user_threading_wins():
  env = cpu_devices.single_thread_environment({'HOME': '/h'})
  assert env == {'HOME': '/h', 'XLA_FLAGS': '--xla_cpu_multi_thread_eigen=false', 'NPROC': '1'}
  assert cpu_devices.single_thread_environment(env) == env  # applied once
  kept = cpu_devices.single_thread_environment({'XLA_FLAGS': '--xla_dump_to=/x'})
  assert kept['XLA_FLAGS'] == '--xla_dump_to=/x --xla_cpu_multi_thread_eigen=false'
  for mine in ({'NPROC': '4'}, {'XLA_FLAGS': '--xla_cpu_multi_thread_eigen=true'}):
    assert cpu_devices.single_thread_environment(mine) == mine


@pytest.mark.parametrize('bad', [0, -2, 1.5, True])
def test_bad_counts_are_refused(bad):
  with pytest.raises(cpu_devices.CpuDevicesError, match='cpu_devices'):
    cpu_devices.use_cpu_devices(bad, environ={})


def _python(code: str) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', 'NPROC')}
  return subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)


def test_two_devices_before_jax_starts_and_a_clear_error_after():
  proc = _python(
      'import os, jax\n'
      'from bipe_jax.kernels import cpu_devices as c\n'
      'c.use_cpu_devices(2)\n'
      'print(len(jax.devices()), jax.devices()[0].platform, os.environ["XLA_FLAGS"],\n'
      '      os.environ["NPROC"])\n'
      'try:\n'
      '  c.use_cpu_devices(4)\n'
      'except c.CpuDevicesError as e:\n'
      '  print("ERROR", e)\n')
  assert proc.returncode == 0, proc.stderr
  first, second = proc.stdout.strip().splitlines()
  assert first == '2 cpu --xla_cpu_multi_thread_eigen=false 1'
  assert second.startswith('ERROR --cpu_devices=4: JAX already created its devices')


def test_training_cli_refuses_a_bad_count_in_one_line(tmp_path):
  proc = forkserver.run(
      [sys.executable, 'train/main.py', '--config=configs/tiny.py',
       f'--workdir={tmp_path / "w"}', '--cpu_devices=0'],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip() == ('error: --cpu_devices=0 is invalid: must be an integer >= 1')
  assert not (tmp_path / 'w').exists()
