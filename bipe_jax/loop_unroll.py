"""Whether the step's inner `lax.scan`s are traced unrolled (for XLA's cost model only).

XLA's cost analysis counts a loop's body once, whatever its trip count. The costing programs of
bipe_jax/compile/step_cost.py are traced inside `unrolled()`, where the scans that ask
`scan_unroll()` (the chunked loss, blockwise attention's block loops) are fully unrolled, so
each iteration is costed. Training never enters it: its scans stay loops (one compiled body).
Imports nothing of bipe_jax: attention/ and training/ read it, compile/ sets it.
"""

import contextlib
import contextvars

_UNROLLED = contextvars.ContextVar('bipe_jax_unrolled_scans', default=False)


@contextlib.contextmanager
def unrolled():
  """Traces in this block unroll the scans that read `scan_unroll()`."""
  token = _UNROLLED.set(True)
  try:
    yield
  finally:
    _UNROLLED.reset(token)


def scan_unroll() -> bool | int:
  """`unroll=` for jax.lax.scan: True (every iteration) inside `unrolled()`, else 1."""
  return True if _UNROLLED.get() else 1
