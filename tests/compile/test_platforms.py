"""bipe_jax.platforms: JAX_PLATFORMS=cpu only when unset and the host shows no accelerator; a CPU
run then starts without libtpu's initialisation errors."""

import os
import subprocess
import sys

import pytest

from bipe_jax import platforms
from tests import fixtures

ROOT = fixtures.ROOT
PLATFORMS = 'JAX_PLATFORMS'


@pytest.fixture
def bare_host(tmp_path):
  (tmp_path / 'root' / 'dev').mkdir(parents=True)
  (tmp_path / 'pci' / '0000:00:04.0').mkdir(parents=True)
  (tmp_path / 'pci' / '0000:00:04.0' / 'vendor').write_text('0x8086\n')  # an Intel device
  return {'dev_root': str(tmp_path / 'root'), 'pci_root': str(tmp_path / 'pci')}


def test_cpu_chosen_on_a_host_without_accelerator(bare_host):
  env = {}
  assert platforms.use_cpu_without_accelerator(env, **bare_host)
  assert env == {'JAX_PLATFORMS': 'cpu'}


def test_a_users_choice_is_kept(bare_host):
  env = {'JAX_PLATFORMS': 'tpu'}
  assert not platforms.use_cpu_without_accelerator(env, **bare_host)
  assert env == {'JAX_PLATFORMS': 'tpu'}


@pytest.mark.parametrize('device', ['accel0', 'vfio/0', 'nvidia0', 'kfd'])
def test_nothing_forced_where_an_accelerator_is(bare_host, device):
  path = os.path.join(bare_host['dev_root'], 'dev', device)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  open(path, 'w').close()
  env = {}
  assert not platforms.use_cpu_without_accelerator(env, **bare_host)
  assert env == {}


def test_a_tpu_on_the_pci_bus_counts(bare_host, tmp_path):
  (tmp_path / 'pci' / '0000:00:05.0').mkdir()
  (tmp_path / 'pci' / '0000:00:05.0' / 'vendor').write_text('0x1ae0\n')  # Google: a TPU chip
  env = {}
  assert not platforms.use_cpu_without_accelerator(env, **bare_host)


@pytest.mark.parametrize('variable', ['TPU_NAME', 'TPU_WORKER_ID', 'TPU_ACCELERATOR_TYPE'])
def test_a_tpu_environment_variable_counts(bare_host, variable):
  env = {variable: 'v5litepod-8'}
  assert not platforms.use_cpu_without_accelerator(env, **bare_host)
  assert PLATFORMS not in env


@pytest.mark.skipif(platforms.accelerator_present(), reason='this host has an accelerator')
def test_importing_the_library_on_a_cpu_host_prints_nothing_from_libtpu():
  pytest.importorskip('libtpu')
  env = {k: v for k, v in os.environ.items()
         if k != PLATFORMS and k not in platforms.TPU_ENVIRONMENT}
  # libtpu stays silent when another process holds its host lock (a compile running beside the
  # tests); this makes it probe, and print, every time
  env['ALLOW_MULTIPLE_LIBTPU_LOAD'] = '1'
  run = lambda code: subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,  # pylint: disable=unnecessary-lambda-assignment
                                    capture_output=True, text=True, timeout=120)
  use = 'import jax; print(jax.numpy.ones(2).sum(), jax.default_backend())'
  # a user's script: the library first, or jax first and then the library, as a linen user does
  for program in (f'import bipe_jax.model; {use}',
                  f'import jax, jax.numpy as jnp; from bipe_jax.encodings import rope; {use}'):
    quiet = run(program)
    assert quiet.returncode == 0 and quiet.stdout.split() == ['2.0', 'cpu'], quiet.stderr
    assert quiet.stderr == ''
  noisy = run(use)  # what importing the library avoids: libtpu's probe for a TPU
  assert noisy.returncode == 0 and 'TPU' in noisy.stderr


def test_a_cli_help_prints_nothing_from_libtpu():
  env = {k: v for k, v in os.environ.items() if k != PLATFORMS}
  proc = subprocess.run([sys.executable, '-m', 'bipe_jax.convert', '--help'], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and proc.stderr == '' and '--overwrite' in proc.stdout
