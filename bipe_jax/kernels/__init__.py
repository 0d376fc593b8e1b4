"""The backend seam: every construct tuned for XLA CPU lives behind it, chosen once per run.

`model.kernels` is 'auto' | 'portable' | 'cpu':
  portable  the stock forms XLA's TPU / GPU compilers and GSPMD sharding propagation are built
            for: einsum projections differentiated by JAX, RoPE sin / cos computed in the
            program, `jax.nn.dot_product_attention` for the dense softmax core, no optimization
            barriers (no checkpointed SwiGLU either), no custom primitives (kernels/portable.py).
  cpu       the forms measured faster on this project's CPU host (kernels/cpu.py): 2-D
            projections with a weight-gradient primitive (cpu_matmul.py), RoPE tables computed
            on the host and gathered, a hand-written dense attention backward kept in the fast
            matmul form by optimization barriers (cpu_attention.py), a SwiGLU that recomputes
            silu in the backward pass, the lm-head loss reading transposed hidden states; and
            the process set-up of a CPU run, single-threaded CPU devices and glibc malloc kept
            (process_setup.py).
  auto      'cpu' when the devices the step runs on are CPU devices, else 'portable'.

Both paths compute the same values and gradients up to float rounding (tests/kernels/test_kernels.py).

Who resolves 'auto': the trainer and the evaluation runs with the platform of their mesh's
devices (`bipe_jax.platform_choices.config_for_mesh`): a program compiled on this CPU host for a TPU topology gets the
portable path. A model used directly (no mesh) resolves it with `jax.default_backend()` when it
is traced (`select`).

A path is a module with the same functions (`select` returns it):
  project(equation, x, kernel)                 a projection einsum ('btd,dhk->bhtk', ...)
  swiglu(gate, up)                             silu(gate) * up, the MLP's activation
  rope_cos_sin(positions_BxT, inv_freq, attention_scale, num_positions)
                                               (cos, sin) [B, 1, T, Dh] once per forward pass
  softmax_attention(q, k, v, bias, visible)    softmax(q.k + bias | visible) @ v, float32
  lm_head_scan_inputs(hidden_NxMxD)            what the chunked loss's scan reads besides the
                                               hidden states, per chunk (None: nothing)
  lm_head_kernel_gradient(h_MxD, extra, d_logits_MxV)   h^T d_logits [D, V] float32
"""

from typing import Optional


KERNELS = ('auto', 'portable', 'cpu')


def resolve_kernels(name: str, platform: str) -> str:
  """'portable' | 'cpu' for `model.kernels` = `name` on devices of `platform` ('cpu', 'tpu',
  'gpu', 'cuda', ...): 'auto' is 'cpu' only on CPU devices."""
  if name not in KERNELS:
    raise ValueError(f'model.kernels={name!r} is invalid: must be one of {KERNELS}.')
  if name != 'auto':
    return name
  return 'cpu' if platform == 'cpu' else 'portable'


def select(name: str = 'auto', platform: Optional[str] = None):
  """The module of the path `name` resolves to; `platform` None: `jax.default_backend()`."""
  if name == 'auto' and platform is None:
    import jax  # pylint: disable=import-outside-toplevel
    platform = jax.default_backend()
  # pylint: disable=import-outside-toplevel  (a path's imports load only when it is chosen)
  if resolve_kernels(name, platform) == 'cpu':
    from bipe_jax.kernels import cpu as path
  else:
    from bipe_jax.kernels import portable as path
  return path


def mesh_platform(mesh) -> str:
  """The platform of the devices a mesh (jax.sharding.Mesh) runs on."""
  return mesh.devices.flat[0].platform
