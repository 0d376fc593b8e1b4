"""Fewer Python garbage collections in the suite's processes.

Tracing a Flax model for JAX allocates hundreds of thousands of short-lived objects, and at
Python's default thresholds (700, 10, 10) the collector runs a young-generation pass every 700
net allocations and walks the whole heap (JAX, Flax, Orbax, PyTorch: millions of objects) every
few hundred of those. With the thresholds below, tests/model/test_scan_layers.py took 63 s
instead of 66-71 s on the 2-core machine (one pytest process each). Memory is not the suite's
limit (24 GiB; reference cycles are still collected, later).
"""

import gc

THRESHOLDS = (50_000, 20, 100)  # gen0 allocations, gen0 passes per gen1, gen1 passes per gen2


def collect_less_often(freeze: bool = False) -> None:
  """Raises the collector's thresholds; `freeze` also moves every object alive now (the imported
  modules) to the permanent generation, which no later collection walks (for a process that has
  done its imports: the fork server before it forks)."""
  gc.set_threshold(*THRESHOLDS)
  if freeze:
    gc.freeze()
