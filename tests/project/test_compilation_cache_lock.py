"""The suite's compilation cache is read and written under a lock (tests/conftest.py): a process
reading an entry that another process is still writing waits for the whole entry instead of
reading a truncated one ("Error -5 while decompressing data")."""

import subprocess
import sys

import jax
from jax._src import lru_cache
import pytest

from tests import conftest
from tests.fixtures import cpu_env

VALUE = bytes(range(256)) * 4096  # 1 MiB
# Holds the cache's lock (as a writing JAX process does), writes half of the entry, waits, then
# the rest: a reader that does not take the lock sees the half.
_WRITER = r'''
import sys, time, filelock
path, key = sys.argv[1], sys.argv[2]
value = bytes(range(256)) * 4096
with filelock.FileLock(f'{path}/.lockfile'):
  with open(f'{path}/{key}-cache', 'wb') as f:
    f.write(value[:len(value) // 2])
    f.flush()
    print('half written', flush=True)
    time.sleep(1.5)
    f.write(value[len(value) // 2:])
'''


def _read_while_writing(path, max_size):
  path.mkdir()
  writer = subprocess.Popen([sys.executable, '-c', _WRITER, str(path), 'k'],
                            stdout=subprocess.PIPE, text=True)
  try:
    assert writer.stdout.readline().strip() == 'half written'
    return lru_cache.LRUCache(str(path), max_size=max_size).get('k')
  finally:
    writer.wait(timeout=60)


def test_the_suite_and_its_subprocesses_use_a_size_limit():
  limit = int(conftest.CACHE_MAX_BYTES)
  assert jax.config.jax_compilation_cache_max_size == limit > 2**30
  assert cpu_env(devices=2)['JAX_COMPILATION_CACHE_MAX_SIZE'] == conftest.CACHE_MAX_BYTES


@pytest.mark.slow
def test_a_reader_waits_for_the_writer_with_the_limit_and_not_without(tmp_path):
  limit = int(conftest.CACHE_MAX_BYTES)
  assert _read_while_writing(tmp_path / 'locked', limit) == VALUE
  unlocked = _read_while_writing(tmp_path / 'unlocked', -1)  # JAX's default: no lock
  assert unlocked == VALUE[:len(VALUE) // 2]
