"""`pallas_attention`: the Pallas kernels behind bipe_jax.attention's contract, with a custom VJP.

The forward saves only the output and the per-row log-sum-exp; the backward recomputes each
tile's bias from the position slices (bipe_jax.attention.pallas.backward). Memory is linear in T in both
passes. Lowering: Mosaic on TPU; on CPU the same kernels run in Pallas interpret mode (chosen
when the program is lowered, by `jax.lax.platform_dependent`, so a TPU program compiled ahead of
time on a CPU host still gets Mosaic). There is no GPU (Triton) lowering: the kernels use the
TPU grid spec (scalar prefetch, VMEM scratch accumulated across an "arbitrary" grid axis): the
GPU kernels of the same contract are gpu_attention.py.
"""

import dataclasses
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp

from bipe_jax.attention.mask import AttentionMask
from bipe_jax.attention.pallas import backward as bwd
from bipe_jax.attention.pallas import forward as fwd
from bipe_jax.attention.pallas import layout
from bipe_jax.attention.pallas import sharding
from bipe_jax.attention.pallas import tile_ranges
from bipe_jax.attention.pallas.tile_bias import TileBias
from bipe_jax.encodings import fox

TPU_BLOCK = 128  # tokens are the kernels' lanes on TPU: a multiple of 128 (or the whole padded axis)


@dataclasses.dataclass(frozen=True)
class KernelStatics:
  """The static settings of one kernel call, and the lowering chosen per platform (shared by the
  TPU kernels here and the GPU ones, gpu_attention.py)."""
  tile_bias: TileBias
  scale: float
  causal: bool
  block_q: int
  block_k: int
  interpret: Optional[bool]  # None: interpret on CPU, the compiled kernel elsewhere
  per_head: Optional[bool] = None  # TPU kernels: the tile ranges hold a row per head (FoX)

  def run(self, kernel_fn, *args):
    """kernel_fn(*args, interpret=...) in the mode of the platform the program is lowered for."""
    kw = dict(tile_bias=self.tile_bias, scale=self.scale, causal=self.causal,
              block_q=self.block_q, block_k=self.block_k)
    if self.per_head is not None:
      kw['per_head'] = self.per_head
    if self.interpret is not None:
      return kernel_fn(*args, interpret=self.interpret, **kw)
    return jax.lax.platform_dependent(
        *args, cpu=functools.partial(kernel_fn, interpret=True, **kw),
        default=functools.partial(kernel_fn, interpret=False, **kw))


# ranges: (k_lo, k_hi, q_lo, q_hi) int32 (tile_ranges.py): the tiles each kernel computes
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(static, q, k, v, params, q_info, k_info, ranges, c_q, c_k):
  return static.run(fwd.forward, q, k, v, params, q_info, k_info, *ranges[:2], c_q, c_k)[0]


def _attend_fwd(static, q, k, v, params, q_info, k_info, ranges, c_q, c_k):
  out, lse = static.run(fwd.forward, q, k, v, params, q_info, k_info, *ranges[:2], c_q, c_k)
  return out, (q, k, v, params, q_info, k_info, ranges, c_q, c_k, out, lse)


def _attend_bwd(static, residuals, d_out):
  q, k, v, params, q_info, k_info, ranges, c_q, c_k, out, lse = residuals
  dq, dk, dv, d_params, d_cq, d_ck = static.run(bwd.backward, q, k, v, out, lse, d_out, params,
                                                q_info, k_info, *ranges, c_q, c_k)
  no_ranges = (None,) * len(ranges)
  return dq, dk, dv, d_params.astype(params.dtype), None, None, no_ranges, d_cq, d_ck


_attend.defvjp(_attend_fwd, _attend_bwd)


def _block(requested: int, length: int) -> int:
  """The tile: `requested`, or the whole axis padded to 8 when that is shorter."""
  return min(requested, layout.round_up(length, 8))


def pallas_attention(q_BxHxQxDh: jax.Array,
                     k_BxGxKxDh: jax.Array,
                     v_BxGxKxDh: jax.Array,
                     *,
                     mask: AttentionMask,
                     q_streams: Optional[jax.Array] = None,
                     k_streams: Optional[jax.Array] = None,
                     tile_bias: TileBias = TileBias(),
                     bias_params_HxP: Optional[jax.Array] = None,
                     scale: Optional[float] = None,
                     block_q: int = TPU_BLOCK,
                     block_k: int = TPU_BLOCK,
                     interpret: Optional[bool] = None,
                     batch_axes: sharding.Axes = None,
                     head_axes: sharding.Axes = None,
                     fox_log_pruning_tolerance: float = 0.0) -> jax.Array:
  """Attention with an on-the-fly bias; [B, H, Q, Dh] in q's dtype, equal to
  `bipe_jax.attention.dense_attention` with the matching bias_fn (values and gradients).

  mask: the AttentionMask (causal indices q_pos [B, Q] / k_pos [B, K], padding, documents; no
  mask_fn); q_streams / k_streams: the one int stream the bias reads (token or inter index;
  default the causal indices), or for tile_bias 'fox' the float positions c [B, Q, H] /
  [B, K, H] (they get gradients); tile_bias / bias_params_HxP: the bias kind and its per-head
  parameters (bipe_jax.attention.pallas.tile_bias; zeros for 'none'). Ragged lengths are
  padded to the tiles inside. block_q and block_k must be multiples of 128 on TPU when Q / K
  are longer than them (tokens are the kernels' lanes: forward.py). Under a mesh, the kernels
  run per shard: rows over the mesh axes `batch_axes`, heads over `head_axes`
  (bipe_jax.attention.pallas.sharding). fox_log_pruning_tolerance < 0 (bias 'fox', causal):
  FoX's pruning, per (row, head, tile): a tile whose every weight is provably below
  exp(tolerance) (encodings/fox.py's bound) is neither computed nor fetched (tile_ranges.py).
  """
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  b, h, nq, d = q.shape
  g, nk = k.shape[1], k.shape[2]
  if q.ndim != 4 or k.shape != v.shape or k.shape[0] != b or k.shape[3] != d or h % g:
    raise ValueError(f'pallas attention: q [B, H, Q, Dh] and k, v [B, G, K, Dh] with G dividing '
                     f'H; got {q.shape}, {k.shape}, {v.shape}.')
  if (q_streams is None) != (k_streams is None):
    raise ValueError('pallas attention: q_streams and k_streams must be given together.')
  mask.check(b, nq, nk)
  if mask.mask_fn is not None:
    raise ValueError('pallas attention: the kernels take no mask.mask_fn; use blockwise or '
                     'dense.')
  if jax.default_backend() == 'gpu' and interpret is None:
    raise ValueError("attention_impl='pallas' is the TPU (Mosaic) kernel; on a GPU use "
                     "'pallas_gpu' (the same tile biases in Triton), 'cudnn' or 'auto'.")
  if bias_params_HxP is None:
    bias_params_HxP = jnp.zeros((h, tile_bias.num_params), jnp.float32)
  tile_bias.check_params(bias_params_HxP, h)
  c_q = c_k = None
  if tile_bias.uses_float_positions:  # c [B, T, H] -> rows [B, H, 1, T]
    if q_streams is None or q_streams.ndim != 3:
      raise ValueError("pallas attention: bias 'fox' needs q_streams / k_streams = the float "
                       "positions c [B, T, H].")
    c_q, c_k = (jnp.moveaxis(c, 2, 1)[:, :, None, :] for c in (q_streams, k_streams))
    q_streams = k_streams = None
  if q_streams is None:
    q_streams, k_streams = mask.q_pos, mask.k_pos
  arrays = dict(q=q, k=k, v=v, params=bias_params_HxP, mask=mask, q_streams=q_streams,
                k_streams=k_streams, c_q=c_q, c_k=c_k)
  arrays = {name: x for name, x in arrays.items() if x is not None}
  if fox_log_pruning_tolerance > 0:
    raise ValueError(f'pallas attention: fox_log_pruning_tolerance={fox_log_pruning_tolerance} '
                     'must be a natural log <= 0 (0 = off).')
  prune = (fox_log_pruning_tolerance if fox_log_pruning_tolerance < 0 and mask.causal
           and tile_bias.uses_float_positions else None)
  run = functools.partial(_run_on_shard, tile_bias=tile_bias, scale=scale, block_q=block_q,
                          block_k=block_k, interpret=interpret, prune=prune)
  return sharding.per_shard(run, arrays, num_heads=h, num_kv_heads=g, batch_axes=batch_axes,
                            head_axes=head_axes)


def _run_on_shard(a: dict, *, tile_bias, scale, block_q, block_k, interpret, prune):
  """pallas_attention on one shard's arrays (`a`: the non-None arguments by name)."""
  q, k, v = a['q'], a['k'], a['v']
  nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
  bq, bk = _block(block_q, nq), _block(block_k, nk)
  tq, tk = layout.round_up(nq, bq), layout.round_up(nk, bk)
  mask = a['mask']
  q_info = layout.query_rows(mask.q_pos, a['q_streams'], mask.q_document, tq)
  k_info = layout.key_info(mask.k_pos, a['k_streams'], mask.k_document, mask.k_valid, tk)
  scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
  c_q, c_k = a.get('c_q'), a.get('c_k')
  if c_q is not None:
    c_q, c_k = layout.pad_to(c_q, 3, tq, 0.0), layout.pad_to(c_k, 3, tk, 0.0)
  threshold = None if prune is None else fox.pruning_threshold(q, k, nk, prune)
  ranges = tile_ranges.tile_ranges(q_info, k_info, bq, bk, mask.causal, c_q, c_k, threshold)
  static = KernelStatics(tile_bias, scale, mask.causal, bq, bk, interpret, ranges.per_head)
  # the kernels' layout [B, H, Dh, T] (forward.py: no lane padding of a head dim below 128)
  heads_in_sublanes = lambda x, n: jnp.swapaxes(layout.pad_to(x, 2, n, 0), 2, 3)
  out = _attend(static, heads_in_sublanes(q, tq), heads_in_sublanes(k, tk),
                heads_in_sublanes(v, tk), a['params'], q_info, k_info,
                (ranges.k_lo, ranges.k_hi, ranges.q_lo, ranges.q_hi), c_q, c_k)
  return jnp.swapaxes(out, 2, 3)[:, :, :nq]
