"""`pallas_gpu_dape_attention`: DAPE V1 fused into GPU (Pallas on Triton) attention kernels, with
a custom VJP.

The contract of the TPU kernels' `pallas_dape_attention` (dape_attention.py): per tile of all
heads the kernels compute the scores, the static bias (tile_bias.py: 'alibi' or 'kerple'),
DAPE V1's MLP across the heads (gpu_dape_tiles.py) and the mask, then an online softmax per
head (gpu_dape_forward.py); the backward recomputes the tiles (gpu_dape_backward.py). Nothing
of size [T, T] is stored. Lowering as gpu_attention.py's (`KernelStatics.run`): Triton on a
CUDA GPU, Pallas interpret mode on CPU. Refused in one line: DAPE V2 (its convolution along
the keys would need the neighbouring keys' scores of every head), other biases, mask.mask_fn
and non-causal masks.
"""

import functools
import math
from typing import Mapping, Optional

import jax

from bipe_jax.attention.mask import AttentionMask
from bipe_jax.attention.pallas import gpu_dape_backward as bwd
from bipe_jax.attention.pallas import gpu_dape_forward as fwd
from bipe_jax.attention.pallas import gpu_dape_tiles
from bipe_jax.attention.pallas import layout
from bipe_jax.attention.pallas import sharding
from bipe_jax.attention.pallas.bias_attention import KernelStatics
from bipe_jax.attention.pallas.dape_attention import check_inputs
from bipe_jax.attention.pallas.gpu_attention import GPU_BLOCK
from bipe_jax.attention.pallas.gpu_attention import gpu_block
from bipe_jax.attention.pallas.tile_bias import TileBias


# static: KernelStatics; flat: dape_tile.FlatParams; params: the packed, padded vector
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attend(static, flat, q, k, v, params, q_info, k_info):
  return _attend_fwd(static, flat, q, k, v, params, q_info, k_info)[0]


def _attend_fwd(static, flat, q, k, v, params, q_info, k_info):
  out, lse = static.run(functools.partial(fwd.forward, flat=flat), q, k, v, params, q_info,
                        k_info)
  return out, (q, k, v, params, q_info, k_info, out, lse)


def _attend_bwd(static, flat, residuals, d_out):
  q, k, v, params, q_info, k_info, out, lse = residuals
  dq, dk, dv, d_params = static.run(functools.partial(bwd.backward, flat=flat), q, k, v, out,
                                    lse, d_out, params, q_info, k_info)
  return dq, dk, dv, d_params.astype(params.dtype), None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def pallas_gpu_dape_attention(q_BxHxQxDh: jax.Array,
                              k_BxGxKxDh: jax.Array,
                              v_BxGxKxDh: jax.Array,
                              *,
                              mask: AttentionMask,
                              dape_params: Mapping[str, jax.Array],
                              q_streams: Optional[jax.Array] = None,
                              k_streams: Optional[jax.Array] = None,
                              tile_bias: TileBias = TileBias('kerple'),
                              bias_params_HxP: Optional[jax.Array] = None,
                              scale: Optional[float] = None,
                              block_q: int = GPU_BLOCK,
                              block_k: int = GPU_BLOCK,
                              interpret: Optional[bool] = None,
                              batch_axes: sharding.Axes = None) -> jax.Array:
  """DAPE V1 attention fused into the GPU kernels; [B, H, Q, Dh] in q's dtype, equal to
  `bipe_jax.attention.dense_attention` with the bias's bias_fn and the transform
  `encodings.dape.dape_v1_transform(scores, bias, dape_params)` (values and gradients of q, k,
  v, every DAPE parameter and the bias parameters).

  Arguments as `pallas_dape_attention` (dape_attention.py): dape_params V1's 'w_in' [C, N]
  (C = 2H or H), 'b_in' [N], 'w_out' [N, H], 'b_out' [H]; a causal mask with padding and
  documents (no mask_fn); tile_bias 'alibi' or 'kerple' with bias_params_HxP [H, P]; under a
  mesh the kernels run per shard of batch rows over `batch_axes` (heads never split). block_q /
  block_k are rounded down to powers of two (16 to gpu_attention.MAX_TRITON_BLOCK); ragged
  lengths are padded to the tiles inside. interpret: None picks Triton on a GPU and interpret
  mode on CPU, when the program is lowered.
  """
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  flat, bias_params_HxP, q_streams, k_streams = check_inputs(
      'pallas gpu DAPE attention', q, k, v, mask, dape_params, q_streams, k_streams, tile_bias,
      bias_params_HxP)
  h = q.shape[1]
  if not mask.causal:
    raise ValueError("pallas gpu DAPE attention is causal only; use 'blockwise' or 'dense'.")
  packed = layout.pad_to(flat.pack(dape_params, bias_params_HxP), 0,
                         gpu_dape_tiles.padded_size(flat), 0.0)
  # 'params' [1, size]: replicated over the mesh
  arrays = dict(q=q, k=k, v=v, params=packed[None], mask=mask, q_streams=q_streams,
                k_streams=k_streams)
  run = functools.partial(_run_on_shard, tile_bias=tile_bias, flat=flat, scale=scale,
                          block_q=block_q, block_k=block_k, interpret=interpret)
  return sharding.per_shard(run, arrays, num_heads=h, num_kv_heads=k.shape[1],
                            batch_axes=batch_axes, head_axes=None)


def _run_on_shard(a: dict, *, tile_bias, flat, scale, block_q, block_k, interpret):
  """pallas_gpu_dape_attention on one shard's arrays (`a`: by name, as `per_shard` takes them)."""
  q, k, v, mask = a['q'], a['k'], a['v'], a['mask']
  nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
  bq, bk = gpu_block(block_q, nq), gpu_block(block_k, nk)
  tq, tk = layout.round_up(nq, bq), layout.round_up(nk, bk)
  q_info = layout.query_info(mask.q_pos, a['q_streams'], mask.q_document, tq)
  k_info = layout.key_info(mask.k_pos, a['k_streams'], mask.k_document, mask.k_valid, tk)
  scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
  static = KernelStatics(tile_bias, scale, mask.causal, bq, bk, interpret)
  out = _attend(static, flat, layout.pad_to(q, 2, tq, 0), layout.pad_to(k, 2, tk, 0),
                layout.pad_to(v, 2, tk, 0), a['params'][0], q_info, k_info)
  return out[:, :, :nq]
