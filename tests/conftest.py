"""Shared pytest set-up: repo root on sys.path (for `configs`), CPU only, fast XLA compiles, one
compilation cache written safely by parallel workers, the shared fixtures of tests/fixtures.py.

The suite's models are tiny, so its time goes to XLA compiling them, not to running them: at
LLVM's default optimisation level one compile of a 3-layer width-32 model's init takes ~6 s on
the 2-core machine, at level 0 ~2.5 s. The tests check what is computed, which the backend's
optimisation level does not change (matmuls are library calls either way), so the suite — and
every subprocess it starts, which inherits this environment (tests/fixtures.py's `cpu_env` keeps
the flags when it sets a device count) — compiles at level 0 unless XLA_FLAGS already sets a level.
It also compiles fusions with XLA's legacy elemental emitters (`--xla_cpu_use_fusion_emitters=
false`): the MLIR fusion emitters spend ~20 ms per fusion, most of a tiny model's compile (a
2-layer training gradient: 2.5 s -> 1.3 s on the 2-core machine); both emit the same HLO
computation. And it emits each program as one LLVM module (`--xla_cpu_parallel_codegen_split_count=
1`): XLA's default splits a program's LLVM module into parts compiled on parallel threads, which
on two cores costs more CPU than it saves (the compiles of five tiny models' gradients: 8.1-8.7 s
of CPU, 6.0-6.3 s with one module). fixtures.FAST_COMPILE_FLAGS lists the flags; one set in
XLA_FLAGS is kept.

For the same reason the suite shares one persistent compilation cache among its pytest-xdist
workers and the subprocesses they start (a fresh temporary directory per `pytest` invocation,
removed at its end; JAX_COMPILATION_CACHE_DIR set by the caller is kept): a computation that
several tests or CLI runs build alike is compiled once.

Writing that cache safely from several processes. JAX's cache (jax._src.lru_cache.LRUCache)
writes an entry with a plain `write_bytes` and, with its default size limit (-1: none), reads
and writes without a lock: a process reading an entry another process is still writing gets a
truncated file ("Error -5 while decompressing data"). With a size limit set the cache takes an
fcntl file lock (`<cache>/.lockfile`, the `filelock` package, pinned in requirements-interop.txt
which `make test` installs) around every read and write, so a reader waits for the writer to
finish (tests/project/test_compilation_cache_lock.py shows both behaviours). The suite sets JAX_COMPILATION_CACHE_MAX_SIZE (a limit
far above what it writes: nothing is evicted) in the environment that the workers and every
subprocess inherit, so all of them use the lock. Since each store then lists the cache directory,
only compiles of at least a quarter second (subprocesses) or a second (the pytest processes)
are stored.
"""

import atexit
import os
import shutil
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
from tests import fixtures  # noqa: E402  (imports neither JAX nor bipe_jax)
from tests import gc_settings  # noqa: E402
gc_settings.collect_less_often()
if os.environ['JAX_PLATFORMS'] == 'cpu':  # the flags tune XLA's CPU compiler (tests/gpu runs on cuda)
  os.environ['XLA_FLAGS'] = ' '.join(fixtures.with_fast_compile(
      os.environ.get('XLA_FLAGS', '').split()))
CACHE_MAX_BYTES = str(64 * 2**30)  # the lock's switch; the suite writes well under 1 GiB
SUBPROCESS_MIN_COMPILE_SECONDS = '0.25'
IN_PROCESS_MIN_COMPILE_SECONDS = 1.0

if 'JAX_COMPILATION_CACHE_DIR' not in os.environ and not os.environ.get('PYTEST_XDIST_WORKER'):
  # This module is imported by the controlling pytest process before it starts the workers,
  # which inherit the environment.
  _cache_dir = tempfile.mkdtemp(prefix='bipe_jax_test_xla_cache_')
  atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _cache_dir
  # Which compiles are stored. With a size limit, every store lists the whole cache directory and
  # reads each entry's access-time file (jax._src.lru_cache's eviction check), so a store costs
  # more the fuller the cache is. The subprocesses (CLI runs: `SUBPROCESS_MIN_COMPILE_SECONDS`,
  # this variable, which they inherit) store compiles of a quarter second or more: their tiny
  # models' init and training step compile in 0.3-0.6 s at level 0, the same ones again and
  # again across the suite's runs. The pytest processes themselves store only compiles of a
  # second or more (`pytest_configure`): their tests seldom compile a program twice, and storing
  # their many shorter compiles slowed the in-process files by about as much as it saved.
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = SUBPROCESS_MIN_COMPILE_SECONDS
os.environ.setdefault('JAX_COMPILATION_CACHE_MAX_SIZE', CACHE_MAX_BYTES)

# pylint: disable=wrong-import-position,unused-import
from tests.fixtures import dirs, trained_rope_run, trained_run  # noqa: E402,F401


def pytest_configure(config):
  """In a process that runs tests (a pytest-xdist worker, or pytest without workers): store
  only compiles of IN_PROCESS_MIN_COMPILE_SECONDS or more in the shared cache (see above). The
  controlling process of a pytest-xdist run imports no JAX."""
  if os.environ.get('PYTEST_XDIST_WORKER') or not getattr(config.option, 'numprocesses', None):
    import jax  # pylint: disable=g-import-not-at-top
    jax.config.update('jax_persistent_cache_min_compile_time_secs',
                      IN_PROCESS_MIN_COMPILE_SECONDS)

TEST_SECONDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'test_seconds.json')


def _recorded_seconds() -> dict:
  """tests/test_seconds.json (`make test-times` rewrites it from a whole run): {'files': each
  file's seconds, 'slow': each test of 1 s or more}; empty when missing or unreadable."""
  import json  # pylint: disable=g-import-not-at-top
  try:
    with open(TEST_SECONDS, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
  """Two uses of the recorded seconds of a past whole run (tests/test_seconds.json):

  - Tiers: a test that took 1 s or more there is marked `slow`, like the end-to-end tests marked
    in their files, so `make test-fast` (the edit loop: `-m "not slow"`) leaves it out; `make
    test` runs every test.
  - Order: the files go to pytest-xdist's workers longest first (`--dist loadfile
    --no-loadscope-reorder`, as `make test` runs it, gives out whole files in collection
    order), so that the run does not end with one worker on a long file while the other is
    idle. A file the record does not list counts as a minute, so a new file is scheduled early
    rather than last. Within a file the order is unchanged.
  """
  del config
  recorded = _recorded_seconds()
  slow, files = recorded.get('slow', {}), recorded.get('files', {})
  rank = {}
  for index, item in enumerate(items):
    if item.nodeid in slow:
      item.add_marker(pytest.mark.slow)
    path = item.nodeid.split('::')[0]
    rank.setdefault(path, (-files.get(path, 60.0), index))
  items.sort(key=lambda item: rank[item.nodeid.split('::')[0]])
