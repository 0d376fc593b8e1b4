"""Causal attention with per-block positional biases and score transforms.

Layout is [B, H, T, Dh] throughout (benchmarks/attention_layouts.py: 3x faster on XLA CPU than
[B, T, H, Dh]).
GQA: keys / values have G heads, G divides H; query head h reads KV head h // (H // G)
(the Hugging Face `repeat_kv` order).

The implementations share one contract:
  dense_attention      one block: the whole [B, H, Q, K] score matrix.
  blockwise_attention  flash-style online softmax over key blocks, inside a scan over query
                       blocks; blocks entirely above the causal diagonal are skipped
                       (`lax.cond`); biases / transforms are evaluated per block from position
                       slices, so no [T, T] array is ever built. Memory is linear in T,
                       training included (a flash-style custom VJP: attention/flash.py).
  fused_attention      `jax.nn.dot_product_attention` (XLA on CPU, cuDNN on GPU where it
                       applies) for schemes with no transform and no bias but an optional
                       per-key bias [B, H, 1, K]: the RoPE family, and the ALiBi family through
                       `alibi.alibi_key_bias` (see there for when that identity holds).
  cudnn_attention      the same, forced to `implementation='cudnn'` (GPU only).
  pallas_attention     Pallas kernels (bipe_jax.attention.pallas) that compute ALiBi / Kerple / T5 biases
                       per tile from a bias kind and its per-head parameters (`tile_bias`,
                       `bias_params_HxP`) instead of a bias_fn; linear memory in both passes.

The mask. Every implementation takes `mask: AttentionMask` (attention/mask.py), one value for
which (query, key) pairs may attend:
  q_pos [B, Q] / k_pos [B, K]   CAUSAL indices (the token's index in its row, or the cache slot
                                while decoding); with `causal` (static, default True) key k is
                                visible to query q iff k_pos <= q_pos;
  k_valid [B, K] | None         False for padding keys;
  q_document / k_document       [B, Q] / [B, K] ids: no attention across packed documents;
  mask_fn | None                mask_fn(q_streams, k_streams) -> bool [B or 1, q, k] for anything
                                else (static; dense and blockwise only).
Masks are applied AFTER the transform, so nothing of a masked pair reaches the softmax. The
common case is `AttentionMask.causal_from_positions(q_pos, k_pos)`.

Streams. The positional streams an encoding reads (token, inter, ...) travel separately as
`q_streams` / `k_streams`: any pytree of arrays whose two leading axes are [B, Q] / [B, K]; they
are sliced per block and handed to the callbacks (when None, the callbacks receive q_pos /
k_pos).

Callbacks:
  bias_fn(q_streams, k_streams) -> [B or 1, H, q, k] float32 additive bias.
  transform_fn(scores, bias, q_pos, k_pos, k_in_range) -> adapted scores [B, H, q, k]
    (DAPE). scores = q.k * scale in float32 [B, H, q, k]; bias as returned by bias_fn or None;
    q_pos [B, q], k_pos [B, k] the mask's causal indices; k_in_range [B, k] bool, False for
    keys outside [0, K) and for padding keys (mask.k_valid False): the zero padding of a
    convolution over keys, so left padding is invisible to DAPE V2 as it is to the positions.
    When a transform is given the bias is NOT added by the attention: the transform returns
    the final logits (DAPE: S + B + f([S; B])).
    `transform_halo` (blockwise only) = extra keys the transform needs on each side of a key
    block (DAPE V2 with kernel k: 2 * (k // 2)); the block's keys are widened by the halo,
    transformed, then cropped.
Softmax runs in float32; a query row with no visible key returns zeros (not NaN).
"""

import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from bipe_jax.attention import flash as flash_attention
from bipe_jax.attention import support as attention_support
from bipe_jax import kernels as kernels_lib
from bipe_jax.kernels.gqa_products import NEG_INF
from bipe_jax.kernels.gqa_products import attention_scores
from bipe_jax.kernels.gqa_products import weighted_values
from bipe_jax.attention.blocks import block_logits as _block_logits
from bipe_jax.attention.mask import AttentionMask

BiasFn = Callable[[Any, Any], jax.Array]
TransformFn = Callable[..., jax.Array]

ATTENTION_IMPLS = attention_support.ATTENTION_IMPLS
FUSED_IMPLS = attention_support.FUSED_IMPLS


def _check_shapes(q, k, v, mask: AttentionMask):
  """ValueError unless q [B, H, Q, Dh], k = v [B, G, K, Dh] (G divides H) and `mask` fits."""
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f'q, k, v must be [B, H, T, Dh]; got {q.shape}, {k.shape}, {v.shape}.')
  b, h, nq, d = q.shape
  if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
    raise ValueError(f'k and v must be [B, G, K, Dh] matching q {q.shape}; got k {k.shape}, '
                     f'v {v.shape}.')
  g = k.shape[1]
  if h % g:
    raise ValueError(f'query heads ({h}) must be a multiple of KV heads ({g}).')
  mask.check(b, nq, k.shape[2])


def _check_streams(q_streams, k_streams):
  if (q_streams is None) != (k_streams is None):
    raise ValueError('q_streams and k_streams must be given together (or both None).')


def dense_attention(q_BxHxQxDh: jax.Array,
                    k_BxGxKxDh: jax.Array,
                    v_BxGxKxDh: jax.Array,
                    *,
                    mask: AttentionMask,
                    q_streams: Any = None,
                    k_streams: Any = None,
                    bias_fn: Optional[BiasFn] = None,
                    transform_fn: Optional[TransformFn] = None,
                    scale: Optional[float] = None,
                    kernels: str = 'auto') -> jax.Array:
  """Attention over the full [Q, K] score matrix; returns [B, H, Q, Dh] in q's dtype.

  See the module docstring for the arguments (mask: q_pos [B, Q], k_pos [B, K], ...).
  Without a transform, the softmax core is the `kernels` path's (bipe_jax.kernels: 'auto' |
  'portable' | 'cpu').
  """
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  _check_shapes(q, k, v, mask)
  _check_streams(q_streams, k_streams)
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  if q_streams is None:
    q_streams, k_streams = mask.q_pos, mask.k_pos
  vis = mask.visible(q_streams, k_streams)
  if transform_fn is None:
    bias = None if bias_fn is None else bias_fn(q_streams, k_streams).astype(jnp.float32)
    core = kernels_lib.select(kernels).softmax_attention
    return core(q * jnp.asarray(scale, q.dtype), k, v, bias, vis).astype(q.dtype)
  # padding keys count as outside the row for a key-axis transform (mask.keys_in_range)
  logits = _block_logits(q, k, mask, q_streams, k_streams, scale=scale, bias_fn=bias_fn,
                         transform_fn=transform_fn)
  logits = jnp.where(vis, logits, NEG_INF)
  # The softmax does not depend on the shift m: stopping its gradient is exact and saves the
  # select-scatter that differentiating max costs over [B, H, Q, K].
  m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  p = jnp.where(vis, jnp.exp(logits - m), 0.0)
  denom = jnp.sum(p, axis=-1, keepdims=True)
  out = weighted_values(p, v) / jnp.where(denom == 0.0, 1.0, denom)
  return out.astype(q.dtype)


def blockwise_attention(q_BxHxQxDh: jax.Array,
                        k_BxGxKxDh: jax.Array,
                        v_BxGxKxDh: jax.Array,
                        *,
                        mask: AttentionMask,
                        q_streams: Any = None,
                        k_streams: Any = None,
                        bias_fn: Optional[BiasFn] = None,
                        transform_fn: Optional[TransformFn] = None,
                        transform_halo: int = 0,
                        scale: Optional[float] = None,
                        block_size: int = 128,
                        kernels: str = 'auto',
                        block_prune=None) -> jax.Array:
  """Flash-style attention, equal to `dense_attention` (outputs and gradients, float32).

  Query blocks are a `lax.scan`; inside each, a `lax.scan` over key blocks keeps the running
  max / normaliser / weighted sum (online softmax) and skips, with `lax.cond`, every key block
  whose smallest causal index is above the largest query index of the block (about half the
  blocks for a causal square problem). Q and K need not be multiples of `block_size` (the tails
  are padded and masked); block sizes shrink to Q or K when those are smaller, and when both
  fit in one block this is `dense_attention` itself (measured faster there).

  Memory is linear in T in the forward AND the backward pass: a flash-style custom VJP
  (bipe_jax/attention/flash.py) saves only the output and the per-row log-sum-exp and
  recomputes each block's scores, bias and transform in the backward pass.

  `transform_halo`: see the module docstring (DAPE V2 needs 2 * (kernel // 2)).
  `kernels`: the backend path of the one-block case (`dense_attention`'s softmax core).
  `block_prune`: skip key blocks whose bias bound is below a threshold (flash.py;
  FoX's pruning, encodings/fox.py); the one-block case prunes nothing.
  Returns [B, H, Q, Dh] in q's dtype.
  """
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  _check_shapes(q, k, v, mask)
  _check_streams(q_streams, k_streams)
  if block_size <= 0:
    raise ValueError(f'block_size must be positive, got {block_size}.')
  if transform_halo < 0:
    raise ValueError(f'transform_halo must be >= 0, got {transform_halo}.')
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  if q.shape[2] <= block_size and k.shape[2] <= block_size:
    # One block: exactly the dense computation, without the scan / remat overhead.
    return dense_attention(q, k, v, mask=mask, q_streams=q_streams, k_streams=k_streams,
                           bias_fn=bias_fn, transform_fn=transform_fn, scale=scale,
                           kernels=kernels)
  if q_streams is None:
    q_streams, k_streams = mask.q_pos, mask.k_pos
  return flash_attention.flash_blockwise_attention(
      q, k, v, mask=mask, q_streams=q_streams, k_streams=k_streams, bias_fn=bias_fn,
      transform_fn=transform_fn, transform_halo=transform_halo, scale=scale,
      block_size=block_size, block_prune=block_prune)


def fused_attention(q_BxHxQxDh: jax.Array,
                    k_BxGxKxDh: jax.Array,
                    v_BxGxKxDh: jax.Array,
                    *,
                    mask: AttentionMask,
                    scale: Optional[float] = None,
                    plain_causal: bool = False,
                    key_bias_BxHx1xK: Optional[jax.Array] = None,
                    implementation: Optional[str] = None) -> jax.Array:
  """`jax.nn.dot_product_attention` in our layout and mask conventions (no bias_fn /
  transform; an optional per-key bias [B or 1, H, 1, K] added to every query's logits).

  `plain_causal=True` is the caller's promise that mask.q_pos = mask.k_pos = 0..T-1 in every
  row (the model's training forward): then, when nothing but causality masks
  (`mask.only_causal`), the fused kernel gets `is_causal=True` and no [Q, K] mask is built.
  Otherwise an explicit boolean mask [B, 1, Q, K] is built from the mask (which may not carry a
  mask_fn: there are no streams here). `implementation`: None (XLA on CPU, cuDNN on GPU where it
  applies) | 'xla' | 'cudnn'.
  """
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  _check_shapes(q, k, v, mask)
  if mask.mask_fn is not None:
    raise ValueError('fused attention takes no mask.mask_fn (it has no streams to give it); '
                     "use 'blockwise' or 'dense'.")
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  to_bthd = lambda x: jnp.swapaxes(x, 1, 2)
  bias = None if key_bias_BxHx1xK is None else key_bias_BxHx1xK.astype(q.dtype)
  plain = plain_causal and mask.only_causal and q.shape[2] == k.shape[2]
  if plain:
    out = jax.nn.dot_product_attention(to_bthd(q), to_bthd(k), to_bthd(v), bias=bias,
                                       scale=scale, is_causal=True,
                                       implementation=implementation)
  else:
    vis = mask.visible(None, None)
    out = jax.nn.dot_product_attention(to_bthd(q), to_bthd(k), to_bthd(v), bias=bias, mask=vis,
                                       scale=scale, implementation=implementation)
  return jnp.swapaxes(out, 1, 2)


def _fused_impl(impl: str, implementation: Optional[str]) -> Callable[..., jax.Array]:
  """attention_impl=`impl` ('fused' | 'cudnn'): `fused_attention` with `implementation`, after
  checking that no bias_fn, score transform or mask.mask_fn is asked for (ValueError otherwise)
  and, for cuDNN, that the backend is a GPU."""

  def attend(q_BxHxQxDh: jax.Array, k_BxGxKxDh: jax.Array, v_BxGxKxDh: jax.Array, *,
             mask: AttentionMask, bias_fn: Optional[BiasFn] = None,
             transform_fn: Optional[TransformFn] = None, **kwargs) -> jax.Array:
    if bias_fn is not None or transform_fn is not None or mask.mask_fn is not None:
      raise ValueError(f"attention_impl={impl!r} supports no bias_fn, score transform or "
                       "mask_fn (encodings without bias, and the ALiBi family through a per-key "
                       "bias); use 'blockwise' or 'dense' for this encoding.")
    backend = jax.default_backend()
    if implementation == 'cudnn' and backend != 'gpu':
      raise ValueError(f"attention_impl='cudnn' needs a CUDA GPU, but the JAX backend is "
                       f"'{backend}'; use attention_impl='fused', 'blockwise' or 'dense'.")
    return fused_attention(q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh, mask=mask,
                           implementation=implementation, **kwargs)

  attend.__name__ = f'{impl}_attention'
  return attend


# attention_impl='fused': JAX's choice of implementation (XLA on CPU and TPU, cuDNN on GPU
# where it applies); 'cudnn': forced cuDNN, GPU only.
xla_fused_attention = _fused_impl('fused', None)
cudnn_attention = _fused_impl('cudnn', 'cudnn')


def _tile_bias_impl(impl: str) -> Callable[..., jax.Array]:
  """attention_impl=`impl` ('pallas': the TPU kernel, 'pallas_gpu': the GPU one): the bias as
  `tile_bias` / `bias_params_HxP`; ValueError for a bias_fn, score transform or mask.mask_fn."""

  def attend(q_BxHxQxDh: jax.Array, k_BxGxKxDh: jax.Array, v_BxGxKxDh: jax.Array, *,
             mask: AttentionMask, bias_fn: Optional[BiasFn] = None,
             transform_fn: Optional[TransformFn] = None, **kwargs) -> jax.Array:
    if bias_fn is not None or transform_fn is not None or mask.mask_fn is not None:
      raise ValueError(f"attention_impl={impl!r} takes the bias as tile_bias / bias_params_HxP "
                       "(ALiBi, Kerple, T5 or none), not a bias_fn, score transform or mask_fn; "
                       "use 'blockwise' or 'dense' for this encoding.")
    from bipe_jax.attention import pallas  # pylint: disable=import-outside-toplevel (Pallas loads slowly)
    kernel = pallas.pallas_attention if impl == 'pallas' else pallas.pallas_gpu_attention
    return kernel(q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh, mask=mask, **kwargs)

  attend.__name__ = f'{impl}_attention'
  return attend


pallas_attention = _tile_bias_impl('pallas')
pallas_gpu_attention = _tile_bias_impl('pallas_gpu')


def attention_fn(impl: str) -> Callable[..., jax.Array]:
  """The attention function for `model.attention_impl` (see ATTENTION_IMPLS)."""
  impls = {'dense': dense_attention, 'blockwise': blockwise_attention,
           'cudnn': cudnn_attention, 'fused': xla_fused_attention, 'pallas': pallas_attention,
           'pallas_gpu': pallas_gpu_attention}
  if impl not in impls:
    raise ValueError(f'attention_impl must be one of {ATTENTION_IMPLS[1:]} (resolve \'auto\' '
                     f'first: attention.support.resolve_attention_impl), got {impl!r}.')
  return impls[impl]
