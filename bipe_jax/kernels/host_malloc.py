"""Keep freed host memory inside the process, so XLA's CPU buffers are reused, not faulted in.

With glibc's default malloc, the large buffers an XLA CPU step allocates and frees (activations,
logits, gradients: megabytes each) go back to the kernel after every step — through munmap, heap
trimming, or the per-thread arenas' madvise — and the next step touches fresh pages: each one a
minor page fault. Measured on the project's 2-core machine (tiny preset, batch 32 x 64 tokens,
`train/main.py --cpu_devices=2`, 200 steps, load < 2, 2026-11-23): 11.1 M minor page faults and
28 s of kernel time in a 70 s run, 6.6-7.1 k tokens/s; with `keep_freed_memory()` 0.3 M faults,
3 s of kernel time, 8.1-8.7 k tokens/s (the same losses: the numbers computed do not change).

`keep_freed_memory()` sets three glibc malloc options with mallopt(3): one arena for every thread
(M_ARENA_MAX=1: the main heap, which is grown with brk and reused), no mmap-served allocations
(M_MMAP_MAX=0) and no trimming of the heap's top (M_TRIM_THRESHOLD at its maximum). The price is
that the process keeps the memory of its peak until it exits, which a training or evaluation
run reaches again every step anyway. Call it first thing in a process, before JAX starts its
backend threads (train/main.py and eval/*.py do, and the benchmarks that time a training step,
through benchmarks/jax_step.use_cpu_devices); later calls do nothing.

A user's own malloc settings win: when any of GLIBC_TUNABLES or the MALLOC_*_ variables is in the
environment, nothing is changed. On a C library other than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

# mallopt(3) parameter numbers (glibc's <malloc.h>).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1))

# Environment variables through which a user sets glibc malloc themselves.
USER_MALLOC_VARIABLES = ('GLIBC_TUNABLES', 'MALLOC_ARENA_MAX', 'MALLOC_ARENA_TEST',
                         'MALLOC_MMAP_MAX_', 'MALLOC_MMAP_THRESHOLD_', 'MALLOC_TOP_PAD_',
                         'MALLOC_TRIM_THRESHOLD_')

_applied: str | None = None  # why the last call did or did not change malloc


def user_chose_malloc(environ=None) -> bool:
  """Whether the environment already carries glibc malloc settings of the user's."""
  environ = os.environ if environ is None else environ
  return any(name in environ for name in USER_MALLOC_VARIABLES)


def keep_freed_memory(environ=None) -> str:
  """Applies the settings above once per process; returns what it did, in words.

  'applied' (this call or an earlier one), 'user settings kept' (a variable of
  USER_MALLOC_VARIABLES is set), 'not glibc', or which parameters glibc refused (logged as a
  warning; nothing else changes, the run goes on at the default's speed).
  """
  global _applied  # pylint: disable=global-statement
  if _applied is not None:
    return _applied
  if user_chose_malloc(environ):
    _applied = 'user settings kept'
  elif platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc':
    _applied = 'not glibc'
  else:
    libc = ctypes.CDLL(None)
    failed = [param for param, value in SETTINGS if libc.mallopt(param, value) != 1]
    _applied = 'applied'
    if failed:  # a speed setting: the run goes on without it, and says so
      _applied = f'mallopt refused parameters {failed} (glibc {platform.libc_ver()[1]})'
      logging.warning('host_malloc: %s; freed host memory may be faulted in again', _applied)
  return _applied
