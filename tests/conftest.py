"""Shared pytest set-up: repo root on sys.path (for `configs`), CPU only, fast XLA compiles.

The suite's models are tiny, so its time goes to XLA compiling them, not to running them: at
LLVM's default optimisation level one compile of a 3-layer width-32 model's init takes ~6 s on
the 2-core machine, at level 0 ~2.5 s. The tests check what is computed, which the backend's
optimisation level does not change (matmuls are library calls either way), so the suite — and
every subprocess it starts, which inherits this environment — compiles at level 0 unless
XLA_FLAGS already sets a level.

For the same reason the suite shares one persistent compilation cache among its pytest-xdist
workers and the subprocesses they start (a fresh temporary directory per `pytest` invocation,
removed at its end; JAX_COMPILATION_CACHE_DIR set by the caller is kept): a computation that
several tests or CLI runs build alike is compiled once.
"""

import atexit
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
FAST_COMPILE_FLAG = '--xla_backend_optimization_level=0'
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {FAST_COMPILE_FLAG}'.strip()

if 'JAX_COMPILATION_CACHE_DIR' not in os.environ and not os.environ.get('PYTEST_XDIST_WORKER'):
  # This module is imported by the controlling pytest process before it starts the workers,
  # which inherit the environment.
  _cache_dir = tempfile.mkdtemp(prefix='bipe_jax_test_xla_cache_')
  atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _cache_dir
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
