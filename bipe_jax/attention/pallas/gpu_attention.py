"""`pallas_gpu_attention`: the tile-bias attention for GPUs (Pallas on Triton), with a custom VJP.

The same contract as `bipe_jax.attention.pallas.pallas_attention` (the TPU kernel): the bias is a
`TileBias` kind ('none', 'alibi', 'kerple', 't5') with per-head parameters [H, P], computed per
tile from position slices; masks, GQA and ragged lengths as bipe_jax.attention; values and
gradients (q, k, v and the bias parameters) equal dense attention with the matching bias_fn.
The forward saves only the output and the per-row log-sum-exp; the backward recomputes each
tile (gpu_backward.py). Memory is linear in T in both passes.

Lowering: Triton on a CUDA GPU; on CPU the same kernels run in Pallas interpret mode (chosen when
the program is lowered, by `jax.lax.platform_dependent`, so a GPU program lowered ahead of time on
a CPU host still gets Triton). Triton needs power-of-two tiles (>= 16), head dim and parameter
count; the tiles here are powers of two, and a shorter sequence is padded to one tile.
"""

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp

from bipe_jax.attention.mask import AttentionMask
from bipe_jax.attention.pallas import gpu_backward as bwd
from bipe_jax.attention.pallas import gpu_forward as fwd
from bipe_jax.attention.pallas import layout
from bipe_jax.attention.pallas import sharding
from bipe_jax.attention.pallas.bias_attention import KernelStatics
from bipe_jax.attention.pallas.tile_bias import TileBias

GPU_BLOCK = 64
MIN_TRITON_BLOCK = 16
# The largest tile: the model passes its block_size, chosen for the XLA blockwise path and TPUs
# (256 in the 151M preset). On an H100 (jax 0.11.2) the 151M step compiled in 8 s with 128-wide
# tiles; with 512-wide ones Triton was still compiling after 130 s.
MAX_TRITON_BLOCK = 128


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(static, q, k, v, params, q_info, k_info):
  return static.run(fwd.forward, q, k, v, params, q_info, k_info)[0]


def _attend_fwd(static, q, k, v, params, q_info, k_info):
  out, lse = static.run(fwd.forward, q, k, v, params, q_info, k_info)
  return out, (q, k, v, params, q_info, k_info, out, lse)


def _attend_bwd(static, residuals, d_out):
  q, k, v, params, q_info, k_info, out, lse = residuals
  dq, dk, dv, d_params = static.run(bwd.backward, q, k, v, out, lse, d_out, params, q_info,
                                    k_info)
  return dq, dk, dv, d_params.astype(params.dtype), None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def gpu_block(requested: int, length: int) -> int:
  """A power-of-two tile <= `requested` and <= MAX_TRITON_BLOCK (>= 16), no longer than `length`
  rounded up to one."""
  fit = max(MIN_TRITON_BLOCK, 1 << max(0, math.ceil(math.log2(max(1, length)))))
  requested = min(requested, MAX_TRITON_BLOCK)
  return min(1 << int(math.log2(max(MIN_TRITON_BLOCK, requested))), fit)


def pallas_gpu_attention(q_BxHxQxDh: jax.Array,
                         k_BxGxKxDh: jax.Array,
                         v_BxGxKxDh: jax.Array,
                         *,
                         mask: AttentionMask,
                         q_streams: Optional[jax.Array] = None,
                         k_streams: Optional[jax.Array] = None,
                         tile_bias: TileBias = TileBias(),
                         bias_params_HxP: Optional[jax.Array] = None,
                         scale: Optional[float] = None,
                         block_q: int = GPU_BLOCK,
                         block_k: int = GPU_BLOCK,
                         interpret: Optional[bool] = None,
                         batch_axes: sharding.Axes = None,
                         head_axes: sharding.Axes = None) -> jax.Array:
  """Attention with an on-the-fly bias; [B, H, Q, Dh] in q's dtype. Arguments as
  `bipe_jax.attention.pallas.pallas_attention` (the TPU kernel); `block_q` / `block_k` are rounded down to
  powers of two (16 to MAX_TRITON_BLOCK)."""
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  b, h, _, d = q.shape
  g = k.shape[1]
  if q.ndim != 4 or k.shape != v.shape or k.shape[0] != b or k.shape[3] != d or h % g:
    raise ValueError(f'pallas gpu attention: q [B, H, Q, Dh] and k, v [B, G, K, Dh] with G '
                     f'dividing H; got {q.shape}, {k.shape}, {v.shape}.')
  if (q_streams is None) != (k_streams is None):
    raise ValueError('pallas gpu attention: q_streams and k_streams must be given together.')
  mask.check(b, q.shape[2], k.shape[2])
  if mask.mask_fn is not None:
    raise ValueError('pallas gpu attention: the kernels take no mask.mask_fn; use blockwise or '
                     'dense.')
  if bias_params_HxP is None:
    bias_params_HxP = jnp.zeros((h, tile_bias.num_params), jnp.float32)
  tile_bias.check_params(bias_params_HxP, h)
  if q_streams is None:
    q_streams, k_streams = mask.q_pos, mask.k_pos
  arrays = dict(q=q, k=k, v=v, params=bias_params_HxP, mask=mask, q_streams=q_streams,
                k_streams=k_streams)
  arrays = {name: x for name, x in arrays.items() if x is not None}
  run = functools.partial(_run_on_shard, tile_bias=tile_bias, scale=scale, block_q=block_q,
                          block_k=block_k, interpret=interpret)
  return sharding.per_shard(run, arrays, num_heads=h, num_kv_heads=g, batch_axes=batch_axes,
                            head_axes=head_axes)


def _run_on_shard(a: dict, *, tile_bias, scale, block_q, block_k, interpret):
  """pallas_gpu_attention on one shard's arrays (`a`: the non-None arguments by name)."""
  q, k, v = a['q'], a['k'], a['v']
  nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
  bq, bk = gpu_block(block_q, nq), gpu_block(block_k, nk)
  tq, tk = layout.round_up(nq, bq), layout.round_up(nk, bk)
  mask = a['mask']
  q_info = layout.query_info(mask.q_pos, a['q_streams'], mask.q_document, tq)
  k_info = layout.key_info(mask.k_pos, a['k_streams'], mask.k_document, mask.k_valid, tk)
  scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
  static = KernelStatics(tile_bias, scale, mask.causal, bq, bk, interpret)
  out = _attend(static, layout.pad_to(q, 2, tq, 0), layout.pad_to(k, 2, tk, 0),
                layout.pad_to(v, 2, tk, 0), a['params'], q_info, k_info)
  return out[:, :, :nq]
