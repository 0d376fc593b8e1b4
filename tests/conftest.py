"""Shared pytest set-up: repo root on sys.path (for `configs`), CPU only, float32 matmuls."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
