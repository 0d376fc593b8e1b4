"""Shared pytest set-up: repo root on sys.path (for `configs`), CPU only, fast XLA compiles.

The suite's models are tiny, so its time goes to XLA compiling them, not to running them: at
LLVM's default optimisation level one compile of a 3-layer width-32 model's init takes ~6 s on
the 2-core machine, at level 0 ~2.5 s. The tests check what is computed, which the backend's
optimisation level does not change (matmuls are library calls either way), so the suite — and
every subprocess it starts, which inherits this environment — compiles at level 0 unless
XLA_FLAGS already sets a level.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
FAST_COMPILE_FLAG = '--xla_backend_optimization_level=0'
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {FAST_COMPILE_FLAG}'.strip()
