"""Attention: the implementations behind one contract, layout [B, H, T, Dh] (see core.py).

Members:
  core.py              dense, blockwise (online softmax), fused (jax.nn.dot_product_attention)
                       and the dispatch by `model.attention_impl` (`attention_fn`)
  mask.py              AttentionMask: the one mask value every implementation takes (causal
                       indices, padding, documents, an optional mask function)
  blocks.py            the per-block pieces (logits, padding, slicing) the paths share
  flash.py             blockwise attention's linear-memory (flash-style) backward pass
  pallas/              Pallas kernels computing ALiBi / Kerple / T5 biases per tile
  context_parallel.py  the sequence sharded over mesh.context (global positions, gathered K/V)
  op.py                AttentionOp: the model layer's one call (the scheme's bias / transform
                       terms in, each implementation's arguments formed, the sharded path)

`from bipe_jax import attention` keeps the names of core.py (dense_attention, ...) and
AttentionMask.
"""

from bipe_jax.attention.core import ATTENTION_IMPLS
from bipe_jax.attention.core import BiasFn
from bipe_jax.attention.core import FUSED_IMPLS
from bipe_jax.attention.core import TransformFn
from bipe_jax.attention.core import attention_fn
from bipe_jax.attention.core import blockwise_attention
from bipe_jax.attention.core import cudnn_attention
from bipe_jax.attention.core import dense_attention
from bipe_jax.attention.core import fused_attention
from bipe_jax.attention.core import pallas_attention
from bipe_jax.attention.core import pallas_gpu_attention
from bipe_jax.attention.core import xla_fused_attention
from bipe_jax.attention.mask import AttentionMask
from bipe_jax.attention.mask import MaskFn

__all__ = ['ATTENTION_IMPLS', 'AttentionMask', 'BiasFn', 'FUSED_IMPLS', 'MaskFn', 'TransformFn',
           'attention_fn', 'blockwise_attention', 'cudnn_attention', 'dense_attention',
           'fused_attention', 'pallas_attention', 'pallas_gpu_attention', 'xla_fused_attention']
