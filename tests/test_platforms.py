"""bipe_jax.platforms: JAX_PLATFORMS=cpu only when unset and the host shows no accelerator; a CPU
run then starts without libtpu's initialisation errors."""

import os
import subprocess
import sys

import pytest

from bipe_jax import platforms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@pytest.mark.skipif(platforms.accelerator_present(), reason='this host has an accelerator')
def test_a_cpu_run_starts_quietly_with_libtpu_installed():
  pytest.importorskip('libtpu')
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  # libtpu stays silent when another process holds its host lock (a compile running beside the
  # tests); this makes it probe, and print, every time
  env['ALLOW_MULTIPLE_LIBTPU_LOAD'] = '1'
  program = ('from bipe_jax import platforms; {}import jax; '
             'print(jax.numpy.ones(2).sum(), jax.default_backend())')
  run = lambda code: subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,  # pylint: disable=unnecessary-lambda-assignment
                                    capture_output=True, text=True, timeout=120)
  quiet = run(program.format('platforms.use_cpu_without_accelerator(); '))
  assert quiet.returncode == 0 and quiet.stdout.split() == ['2.0', 'cpu']
  assert quiet.stderr == ''
  noisy = run(program.format(''))  # what the entry points avoid: libtpu's probe for a TPU
  assert noisy.returncode == 0 and 'TPU' in noisy.stderr
