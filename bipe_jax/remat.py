"""Rematerialisation of the decoder layers (`model.remat`): what the backward pass recomputes.

  'none' (or False)    keep every activation the backward pass needs (fastest, most memory);
  'full' (or True)     keep only each layer's input and recompute the layer in the backward;
  'save_projections'   keep the outputs of the layer's linear projections (query, key, value,
                       out, gate, up, down: `checkpoint_name` tags in model.Projection) and
                       recompute the rest (norms, RoPE, attention scores and softmax, SwiGLU):
                       the matmuls are not run twice, the large elementwise temporaries and
                       the [B, H, T, T]-sized attention intermediates are not kept. On the
                       Pallas TPU path the rotated query and key carry the 'query' / 'key'
                       tags too (model.Attention: rope.rotate_fused), so the backward keeps
                       them, as many bytes, and does not rotate again.

The per-chip memory of each on TPU is measured with train/compile.py (docs/accelerators.md).
"""

from typing import Any

import flax.linen as nn
import jax

REMAT_POLICIES = ('none', 'full', 'save_projections')
# The checkpoint_name tags of model.Projection outputs (the projections' module names).
PROJECTION_NAMES = ('query', 'key', 'value', 'out', 'gate', 'up', 'down')


def remat_name(value: Any) -> str:
  """model.remat -> one of REMAT_POLICIES (False / True are the old 'none' / 'full').

  Raises ValueError naming the allowed values.
  """
  if value is False or value is None:
    return 'none'
  if value is True:
    return 'full'
  if isinstance(value, str) and value in REMAT_POLICIES:
    return value
  raise ValueError(f'model.remat={value!r} is invalid: must be one of {REMAT_POLICIES} '
                   '(or False / True for none / full)')


def remat_layer(layer_cls, value: Any, *, scanned: bool):
  """`layer_cls` wrapped in `nn.remat` as model.remat says (unchanged for 'none')."""
  name = remat_name(value)
  if name == 'none':
    return layer_cls
  policy = None
  if name == 'save_projections':
    policy = jax.checkpoint_policies.save_only_these_names(*PROJECTION_NAMES)
  # Inside nn.scan the loop already keeps XLA from merging recomputation with the forward pass.
  return nn.remat(layer_cls, policy=policy, prevent_cse=not scanned)
