"""`pallas_dape_attention`: DAPE V1 fused into the Pallas TPU attention kernels, with a custom VJP.

Per tile of all heads the kernels compute the scores, the static bias (tile_bias.py), DAPE V1's
MLP across the heads (dape_tile.py) and the mask, then an online softmax per head
(dape_forward.py); the backward recomputes the tiles (dape_backward.py). Nothing of size
[T, T] is stored: memory is linear in T in both passes. Lowering as bias_attention.py's
(`KernelStatics.run`): Mosaic on TPU, interpret mode on CPU. DAPE V2 (a convolution along the
keys) is refused: a tile would have to carry the neighbouring keys' scores of every head.
"""

import functools
import math
from typing import Mapping, Optional

import jax
import jax.numpy as jnp

from bipe_jax.attention.mask import AttentionMask
from bipe_jax.attention.pallas import dape_backward as bwd
from bipe_jax.attention.pallas import dape_forward as fwd
from bipe_jax.attention.pallas import dape_tile
from bipe_jax.attention.pallas import layout
from bipe_jax.attention.pallas import sharding
from bipe_jax.attention.pallas import tile_ranges
from bipe_jax.attention.pallas.bias_attention import TPU_BLOCK
from bipe_jax.attention.pallas.bias_attention import KernelStatics
from bipe_jax.attention.pallas.tile_bias import TileBias

DAPE_KINDS = ('alibi', 'kerple')  # the static biases the fused kernels adapt (the tested ones)


# static: KernelStatics; flat: dape_tile.FlatParams; vmem: the kernels' VMEM limit or None;
# ranges: (k_lo, k_hi, q_lo, q_hi) int32 (tile_ranges.py)
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _attend(static, flat, vmem, q, k, v, flat_params, q_info, k_info, ranges):
  return _attend_fwd(static, flat, vmem, q, k, v, flat_params, q_info, k_info, ranges)[0]


def _attend_fwd(static, flat, vmem, q, k, v, flat_params, q_info, k_info, ranges):
  kernel = functools.partial(fwd.forward, flat=flat, vmem_limit_bytes=vmem)
  out, lse = static.run(kernel, q, k, v, flat_params, q_info, k_info, *ranges[:2])
  return out, (q, k, v, flat_params, q_info, k_info, ranges, out, lse)


def _attend_bwd(static, flat, vmem, residuals, d_out):
  q, k, v, flat_params, q_info, k_info, ranges, out, lse = residuals
  kernel = functools.partial(bwd.backward, flat=flat, vmem_limit_bytes=vmem)
  dq, dk, dv, d_flat = static.run(kernel, q, k, v, out, lse, d_out, flat_params, q_info, k_info,
                                  *ranges)
  return dq, dk, dv, d_flat.astype(flat_params.dtype), None, None, (None,) * len(ranges)


_attend.defvjp(_attend_fwd, _attend_bwd)


def _block(requested: int, length: int) -> int:
  """The tile: `requested`, or the whole axis padded to 8 when that is shorter."""
  return min(requested, layout.round_up(length, 8))


def check_dape_params(dape_params: Mapping[str, jax.Array], num_heads: int,
                      tile_bias: TileBias) -> dape_tile.FlatParams:
  """The packing of DAPE V1's parameters (dape_tile.FlatParams); ValueError (one line) for
  DAPE V2's, a bias the kernels do not adapt, or shapes that do not fit."""
  w_in = dape_params['w_in']
  if w_in.ndim != 2:
    raise ValueError(f'pallas DAPE attention fuses DAPE V1 only: w_in {tuple(w_in.shape)} is '
                     "V2's key-axis convolution; use attention_impl='blockwise' or 'dense'.")
  if tile_bias.kind not in DAPE_KINDS:
    raise ValueError(f'pallas DAPE attention: bias {tile_bias.kind!r} is not one of '
                     f'{DAPE_KINDS}.')
  c, n = w_in.shape
  h = num_heads
  if c not in (h, 2 * h):
    raise ValueError(f'pallas DAPE attention: w_in [C, N] needs C = 2H = {2 * h} (scores and '
                     f'bias) or H = {h} (scores only); got C = {c}.')
  want = dict(b_in=(n,), w_out=(n, h), b_out=(h,))
  for name, shape in want.items():
    if tuple(dape_params[name].shape) != shape:
      raise ValueError(f'pallas DAPE attention: {name} must be {shape}; got '
                       f'{tuple(dape_params[name].shape)}.')
  return dape_tile.FlatParams(c, n, h, tile_bias.num_params)


def check_inputs(what: str, q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh, mask: AttentionMask,
                 dape_params: Mapping[str, jax.Array], q_streams, k_streams,
                 tile_bias: TileBias, bias_params_HxP) -> tuple:
  """The checks both fused DAPE kernels (TPU here, GPU gpu_dape_attention.py) make of their
  inputs, each a one-line ValueError starting with `what`; returns (dape_tile.FlatParams, the
  bias parameters [H, P] (zeros when None), q_streams, k_streams (the causal indices when
  None))."""
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  if q.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3] \
      or q.shape[1] % k.shape[1]:
    raise ValueError(f'{what}: q [B, H, Q, Dh] and k, v [B, G, K, Dh] with G dividing H; got '
                     f'{q.shape}, {k.shape}, {v.shape}.')
  b, h, nq, _ = q.shape
  if (q_streams is None) != (k_streams is None):
    raise ValueError(f'{what}: q_streams and k_streams must be given together.')
  mask.check(b, nq, k.shape[2])
  if mask.mask_fn is not None:
    raise ValueError(f"{what} takes no mask.mask_fn; use 'blockwise' or 'dense'.")
  flat = check_dape_params(dape_params, h, tile_bias)
  if bias_params_HxP is None:
    bias_params_HxP = jnp.zeros((h, tile_bias.num_params), jnp.float32)
  tile_bias.check_params(bias_params_HxP, h)
  if q_streams is None:
    q_streams, k_streams = mask.q_pos, mask.k_pos
  return flat, bias_params_HxP, q_streams, k_streams


def pallas_dape_attention(q_BxHxQxDh: jax.Array,
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
                          block_q: int = TPU_BLOCK,
                          block_k: int = TPU_BLOCK,
                          interpret: Optional[bool] = None,
                          vmem_limit_bytes: Optional[int] = None,
                          batch_axes: sharding.Axes = None) -> jax.Array:
  """DAPE V1 attention fused into the Pallas kernels; [B, H, Q, Dh] in q's dtype, equal to
  `bipe_jax.attention.dense_attention` with the bias's bias_fn and the transform
  `encodings.dape.dape_v1_transform(scores, bias, dape_params)` (values and gradients of q, k,
  v, every DAPE parameter and the bias parameters).

  dape_params: DAPE V1's 'w_in' [C, N] (C = 2H: the features are scores and bias; C = H: the
  scores only, the bias still added), 'b_in' [N], 'w_out' [N, H], 'b_out' [H]; V2's
  parameters (w_in [ks, C, N]) raise ValueError. mask: causal indices, padding, documents (no
  mask_fn); q_streams / k_streams [B, Q] / [B, K]: the int stream the bias reads (default the
  causal indices); tile_bias / bias_params_HxP: the static bias (DAPE_KINDS: 'alibi' or
  'kerple') and its per-head parameters [H, P] (tile_bias.py; Kerple's p and a clamped by the
  caller, as attention/op.py does). Under a mesh the kernels run per shard of
  batch rows over the mesh axes `batch_axes` (bipe_jax.attention.pallas.sharding); all heads
  travel in one tile, so the heads are never split. Ragged lengths are padded to the tiles
  inside; block_q and block_k must be multiples of 128 on TPU when Q / K are longer than them.
  vmem_limit_bytes: the kernels' scoped VMEM (None: Mosaic's default, 16 MiB on v5e, which
  holds 128 x 128 tiles at H = 12, N = 32 (compiled ahead of time for v5e); 256 x 256 tiles
  compile with 48 MiB: the kernels keep [2C + H + N, q, k] float32 tiles in VMEM).
  """
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  flat, bias_params_HxP, q_streams, k_streams = check_inputs(
      'pallas DAPE attention', q, k, v, mask, dape_params, q_streams, k_streams, tile_bias,
      bias_params_HxP)
  h = q.shape[1]
  if jax.default_backend() == 'gpu' and interpret is None:
    raise ValueError('pallas DAPE attention is a TPU (Mosaic) kernel; on a GPU use '
                     "attention_impl='pallas_gpu', 'blockwise' or 'dense'.")
  # 'params' [1, size]: replicated over the mesh (per_shard splits it over heads, here none)
  arrays = dict(q=q, k=k, v=v, params=flat.pack(dape_params, bias_params_HxP)[None],
                mask=mask, q_streams=q_streams, k_streams=k_streams)
  run = functools.partial(_run_on_shard, tile_bias=tile_bias, flat=flat, scale=scale,
                          block_q=block_q, block_k=block_k, interpret=interpret,
                          vmem_limit_bytes=vmem_limit_bytes)
  return sharding.per_shard(run, arrays, num_heads=h, num_kv_heads=k.shape[1],
                            batch_axes=batch_axes, head_axes=None)


def _run_on_shard(a: dict, *, tile_bias, flat, scale, block_q, block_k, interpret,
                  vmem_limit_bytes):
  """pallas_dape_attention on one shard's arrays (`a`: by name, as `per_shard` takes them)."""
  q, k, v, mask = a['q'], a['k'], a['v'], a['mask']
  nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
  bq, bk = _block(block_q, nq), _block(block_k, nk)
  tq, tk = layout.round_up(nq, bq), layout.round_up(nk, bk)
  q_info = layout.query_rows(mask.q_pos, a['q_streams'], mask.q_document, tq)
  k_info = layout.key_info(mask.k_pos, a['k_streams'], mask.k_document, mask.k_valid, tk)
  ranges = tile_ranges.tile_ranges(q_info, k_info, bq, bk, mask.causal)
  scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
  static = KernelStatics(tile_bias, scale, mask.causal, bq, bk, interpret)
  # the kernels' layout [B, H, Dh, T] (forward.py: no lane padding of a head dim below 128)
  heads_in_sublanes = lambda x, n: jnp.swapaxes(layout.pad_to(x, 2, n, 0), 2, 3)
  out = _attend(static, flat, vmem_limit_bytes, heads_in_sublanes(q, tq),
                heads_in_sublanes(k, tk), heads_in_sublanes(v, tk), a['params'][0], q_info,
                k_info, (ranges.k_lo, ranges.k_hi, ranges.q_lo, ranges.q_hi))
  return jnp.swapaxes(out, 2, 3)[:, :, :nq]
