"""host_malloc.keep_freed_memory: freed buffers are reused instead of faulted in again, and a
user's own glibc malloc settings are left alone."""

import os
import subprocess
import sys

import pytest

from bipe_jax.kernels import host_malloc
from tests import fixtures

pytestmark = pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc malloc only')
ROOT = fixtures.ROOT

# Allocates, touches and frees a 64 MiB buffer 10 times; prints what keep_freed_memory said and
# the minor page faults of the loop. Each pass touches 16,384 pages of 4 KiB.
PROBE = r'''
import ctypes, resource, sys
from bipe_jax.kernels import host_malloc
said = host_malloc.keep_freed_memory() if sys.argv[1] == 'tuned' else 'untouched'
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
  buffer = libc.malloc(size)
  ctypes.memset(buffer, 1, size)
  libc.free(buffer)
print(said, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
'''
PAGES_PER_PASS = (64 << 20) // 4096


def _probe(mode, **extra_env):
  env = {k: v for k, v in os.environ.items() if k not in host_malloc.USER_MALLOC_VARIABLES}
  env.update(extra_env, PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, '-c', PROBE, mode], env=env, capture_output=True,
                       text=True, check=True).stdout
  said, faults = out.strip().rsplit(' ', 1)
  return said, int(faults)


def test_freed_buffers_are_reused_instead_of_faulted_in_again():
  said, plain = _probe('untouched')
  assert plain >= 9 * PAGES_PER_PASS  # glibc's default: every pass faults its pages in again
  said, tuned = _probe('tuned')
  assert said == 'applied'
  assert tuned <= 2 * PAGES_PER_PASS  # the first pass only


def test_a_users_own_malloc_settings_win():
  said, faults = _probe('tuned', MALLOC_ARENA_MAX='4')
  assert said == 'user settings kept' and faults >= 9 * PAGES_PER_PASS
  assert host_malloc.user_chose_malloc({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2'})
  assert not host_malloc.user_chose_malloc({'PATH': '/bin', 'XLA_FLAGS': ''})


def test_a_refused_setting_is_a_warning_not_a_stopped_run(monkeypatch, caplog):
  class RefusingLibc:
    def mallopt(self, param, value):
      del value
      return 0 if param == host_malloc.M_ARENA_MAX else 1
  monkeypatch.setattr(host_malloc, '_applied', None)
  monkeypatch.setattr(host_malloc.ctypes, 'CDLL', lambda name: RefusingLibc())
  for name in host_malloc.USER_MALLOC_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  said = host_malloc.keep_freed_memory()
  assert said.startswith('mallopt refused parameters [-8]')
  assert 'freed host memory may be faulted in again' in caplog.text
  assert host_malloc.keep_freed_memory() == said  # decided once per process
