"""The CPU path (model.kernels='cpu', and 'auto' on CPU devices): the forms measured faster on
this project's CPU host (benchmarks/README.md). Values and gradients equal the portable path's
up to float rounding (tests/kernels/test_kernels.py). The function contract is in
bipe_jax/kernels/__init__.py; CPU process set-up (devices, malloc) is in process_setup.py.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax.encodings import rope
from bipe_jax.kernels import cpu_attention
from bipe_jax.kernels import cpu_matmul

# MFU's denominator on CPU (training/flops.py), per host: the float32 matmul rate measured on the
# project's 2-core machine (machines of that kind measure 1.0e11 to 3.8e11;
# benchmarks/matmul_peak.py measures yours, train.peak_flops_per_device overrides it).
PEAK_FLOPS_PER_HOST = 2.0e11

# The projection einsums as one 2-D matmul whose weight gradient keeps the kernel's layout.
project = cpu_matmul.matmul_einsum
# The dense softmax core with a hand-written backward in XLA CPU's fast matmul form.
softmax_attention = cpu_attention.softmax_attention

@jax.checkpoint
def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
  """silu(gate) * up, elementwise; its backward pass recomputes silu from gate and up.

  Saving only the two inputs lets XLA compute the forward in one elementwise pass instead of
  three (sigmoid, silu and the product, each kept for the backward pass): on this project's CPU
  that is 3.6 -> 1.0 ms a layer at [2,048, 512], and the tiny training step 0.987x
  (benchmarks/README.md). Values and gradients are those of the plain expression. (The
  checkpoint puts an optimization barrier in the backward pass.)
  """
  return jax.nn.silu(gate) * up


# Longest position range read from host-computed tables (`rope_cos_sin_lookup`): two float32
# tables of [4096, Dh] are at most 4 MB of constants in the compiled program.
MAX_TABLE_POSITIONS = 4096


def rope_cos_sin_lookup(positions_BxT: jax.Array, inv_freq, num_positions: int,
                        attention_scale: float = 1.) -> tuple[jax.Array, jax.Array]:
  """`rope.rope_cos_sin` for positions known to lie in [0, num_positions): read from tables.

  The [num_positions, Dh] cos / sin tables are computed once on the host (NumPy, at trace time,
  of the same float32 angles pos * [f, f], in float64 then rounded) and gathered by position.
  On XLA CPU this is what keeps the step from evaluating sin / cos over and over: the compiler
  fuses the in-graph tables into every consumer (each layer's q and k rotation and their
  backward, once per head), which cost 7 % of the tiny training step (benchmarks/README.md).
  A position outside the range is clamped into it, so callers must guarantee the range (the
  model does: the streams it computes from token ids lie in [0, T)). `inv_freq` must be a
  concrete array (as `rope_inv_frequencies` returns), not a traced one.
  """
  if not 0 < num_positions <= MAX_TABLE_POSITIONS:
    raise ValueError(f'rope_cos_sin_lookup: num_positions must be in [1, '
                     f'{MAX_TABLE_POSITIONS}], got {num_positions}.')
  inv_freq = np.asarray(inv_freq, dtype=np.float32)
  angles = np.arange(num_positions, dtype=np.float32)[:, None] * inv_freq[None, :]
  angles = np.concatenate([angles, angles], axis=-1).astype(np.float64)
  cos = (np.cos(angles) * attention_scale).astype(np.float32)
  sin = (np.sin(angles) * attention_scale).astype(np.float32)
  take = lambda table: jnp.take(table, positions_BxT, axis=0, mode='clip')[:, None]
  return take(cos), take(sin)


def rope_cos_sin(positions_BxT: jax.Array, inv_freq, attention_scale: float = 1.,
                 num_positions: Optional[int] = None) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) float32 [B, 1, T, Dh], made once per forward pass.

  `num_positions`: a bound the caller guarantees (every position in [0, num_positions)); up to
  MAX_TABLE_POSITIONS the values are read from host tables (`rope_cos_sin_lookup`), otherwise
  computed. The barrier asks XLA to materialise them once; XLA CPU drops it before fusion and
  recomputes computed tables in every consumer, hence the host tables.
  """
  if num_positions is not None and num_positions <= MAX_TABLE_POSITIONS:
    tables = rope_cos_sin_lookup(positions_BxT, inv_freq, num_positions, attention_scale)
  else:
    tables = rope.rope_cos_sin(positions_BxT, inv_freq, attention_scale)
  return jax.lax.optimization_barrier(tables)


def lm_head_scan_inputs(hidden_NxMxD: jax.Array) -> jax.Array:
  """The chunks' hidden states transposed, [N, D, M] (one copy).

  The kernel's gradient h^T @ d_logits reads each chunk's hidden states transposed. Passing
  them into the loss's loop already transposed keeps XLA from folding the transpose into that
  matmul: on CPU the folded form (contracting both operands' leading axis) runs as a slower
  Eigen dot; this one is a plain row-major matmul (the whole tiny-preset training step 0.985x,
  benchmarks/README.md).
  """
  return jnp.swapaxes(hidden_NxMxD, 1, 2)


def lm_head_kernel_gradient(h_MxD: jax.Array, h_t_DxM: jax.Array,
                            d_logits_MxV: jax.Array) -> jax.Array:
  """h^T @ d_logits [D, V] float32, from the transposed copy (`lm_head_scan_inputs`)."""
  return (h_t_DxM.astype(h_MxD.dtype) @ d_logits_MxV).astype(jnp.float32)
