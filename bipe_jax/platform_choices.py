"""The choices made once per run from the platform of the devices it runs on.

`model.kernels='auto'` (bipe_jax.kernels: 'cpu' on CPU devices, else 'portable') and
`model.attention_impl='auto'` (bipe_jax.attention.support: the Pallas TPU kernel on a TPU, cuDNN
or the Triton kernel on a GPU, blockwise on CPU) are resolved here with the platform of the
mesh's devices, not the process's default backend: a program compiled on a CPU host for a TPU
or GPU topology gets the accelerator's choices. The trainer, the evaluation runs and the
ahead-of-time compile call `config_for_mesh` / `model_for_mesh`; a model used directly (no mesh)
resolves them with `jax.default_backend()` when it is traced.
"""

import dataclasses
from typing import Any

from bipe_jax import kernels
from bipe_jax.attention import support

TPU_LANES = 128  # the Pallas TPU kernel's tiles: multiples of the 128 lanes


def config_for_mesh(model_config: Any, mesh) -> Any:
  """`model_config` (a dataclass with a `kernels` field, e.g. ModelConfig) with 'auto' resolved
  for the devices of `mesh`; explicit values are kept. A config that also has `attention_impl`
  and `scheme` gets attention_impl='auto' resolved the same way (and, when that is the Pallas
  TPU kernel, a block_size that is not a multiple of 128 rounded up to one: its tiles)."""
  platform = kernels.mesh_platform(mesh)
  changes = {}
  resolved = kernels.resolve_kernels(model_config.kernels, platform)
  if resolved != model_config.kernels:
    changes['kernels'] = resolved
  if getattr(model_config, 'attention_impl', None) == 'auto':
    changes['attention_impl'] = support.resolve_attention_impl(
        'auto', model_config.scheme, platform, getattr(model_config, 'dtype', 'float32'),
        getattr(model_config, 'causal', True))
    block = getattr(model_config, 'block_size', None)
    if changes['attention_impl'] == 'pallas' and block and block % TPU_LANES:
      # Mosaic tiles: a multiple of 128 tokens (or the whole axis: pallas/bias_attention.py)
      changes['block_size'] = -(-block // TPU_LANES) * TPU_LANES
  return dataclasses.replace(model_config, **changes) if changes else model_config


def model_for_mesh(model: Any, mesh) -> Any:
  """A Flax module whose `config` has a `kernels` field (the Transformer), cloned with 'auto'
  resolved for `mesh` (`config_for_mesh`); any other model is returned as it is."""
  config = getattr(model, 'config', None)
  if not dataclasses.is_dataclass(config) or not hasattr(config, 'kernels'):
    return model
  resolved = config_for_mesh(config, mesh)
  return model if resolved is config else model.clone(config=resolved)
