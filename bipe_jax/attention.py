"""Causal attention with per-block positional biases and score transforms.

Layout is [B, H, T, Dh] throughout (PERFORMANCE.md: 3x faster on XLA CPU than [B, T, H, Dh]).
GQA: keys / values have G heads, G divides H; query head h reads KV head h // (H // G)
(the Hugging Face `repeat_kv` order).

Three implementations share one contract:
  dense_attention      one block: the whole [B, H, Q, K] score matrix.
  blockwise_attention  flash-style online softmax over key blocks, inside a scan over query
                       blocks; blocks entirely above the causal diagonal are skipped
                       (`lax.cond`); biases / transforms are evaluated per block from position
                       slices, so no [T, T] array is ever built. Forward memory is linear in T.
  fused_attention      `jax.nn.dot_product_attention` (XLA on CPU, cuDNN on GPU where it
                       applies) for schemes with no transform and no bias but an optional
                       per-key bias [B, H, 1, K]: the RoPE family, and the ALiBi family through
                       `alibi.alibi_key_bias` (see there for when that identity holds).
  cudnn_attention      the same, forced to `implementation='cudnn'` (GPU only).

Positions. `q_pos` [B, Q] / `k_pos` [B, K] are the CAUSAL indices (the index of the token in its
row, or the cache slot while decoding): key k is visible to query q iff k_pos <= q_pos. The
positional streams an encoding reads (token, inter, ...) travel separately as `q_streams` /
`k_streams`: any pytree of arrays whose two leading axes are [B, Q] / [B, K]; they are sliced
per block and handed to the callbacks (when None, the callbacks receive q_pos / k_pos).

Callbacks:
  bias_fn(q_streams, k_streams) -> [B or 1, H, q, k] float32 additive bias.
  transform_fn(scores, bias, q_pos, k_pos, k_in_range) -> adapted scores [B, H, q, k]
    (DAPE). scores = q.k * scale in float32 [B, H, q, k]; bias as returned by bias_fn or None;
    q_pos [B, q], k_pos [B, k] causal indices; k_in_range [B, k] bool, False for keys outside
    [0, K) and for padding keys (`k_valid` False): the zero padding of a convolution over keys,
    so left padding is invisible to DAPE V2 as it is to the positions. When a transform is given the bias is NOT
    added by the attention: the transform returns the final logits (DAPE: S + B + f([S; B])).
    `transform_halo` (blockwise only) = extra keys the transform needs on each side of a key
    block (DAPE V2 with kernel k: 2 * (k // 2)); the block's keys are widened by the halo,
    transformed, then cropped.
Masks (applied AFTER the transform, so nothing of a masked pair reaches the softmax):
  causal (k_pos <= q_pos), `k_valid` [B, K] (padding), `q_document` / `k_document` [B, Q] /
  [B, K] (no attention across packed documents), and `mask_fn(q_streams, k_streams)` ->
  bool [B or 1, q, k] for anything else.
Softmax runs in float32; a query row with no visible key returns zeros (not NaN).
"""

import functools
import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from bipe_jax import kernels as kernels_lib
from bipe_jax.kernels.gqa_products import NEG_INF
from bipe_jax.kernels.gqa_products import attention_scores
from bipe_jax.kernels.gqa_products import weighted_values
_POS_PAD = jnp.iinfo(jnp.int32).max  # causal index of padded keys (never visible)
_QPOS_PAD = jnp.iinfo(jnp.int32).min  # causal index of padded queries (see nothing)

BiasFn = Callable[[Any, Any], jax.Array]
TransformFn = Callable[..., jax.Array]
MaskFn = Callable[[Any, Any], jax.Array]

ATTENTION_IMPLS = ('dense', 'blockwise', 'cudnn', 'fused')
FUSED_IMPLS = ('cudnn', 'fused')  # jax.nn.dot_product_attention: no bias_fn / transform


def _check_shapes(q, k, v, q_pos, k_pos):
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f'q, k, v must be [B, H, T, Dh]; got {q.shape}, {k.shape}, {v.shape}.')
  b, h, nq, d = q.shape
  if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
    raise ValueError(f'k and v must be [B, G, K, Dh] matching q {q.shape}; got k {k.shape}, '
                     f'v {v.shape}.')
  g = k.shape[1]
  if h % g:
    raise ValueError(f'query heads ({h}) must be a multiple of KV heads ({g}).')
  if q_pos.shape != (b, nq) or k_pos.shape != (b, k.shape[2]):
    raise ValueError(f'q_pos must be [B, Q]={b, nq} and k_pos [B, K]={b, k.shape[2]}; '
                     f'got {q_pos.shape} and {k_pos.shape}.')


def _visible(q_pos, k_pos, causal, k_valid, q_document, k_document, mask_fn, q_streams,
             k_streams):
  """bool [B or 1, 1, q, k]: which (query, key) pairs may attend."""
  b = q_pos.shape[0]
  vis = jnp.ones((b, q_pos.shape[1], k_pos.shape[1]), bool)
  if causal:
    vis = k_pos[:, None, :] <= q_pos[:, :, None]
  if k_valid is not None:
    vis = vis & k_valid[:, None, :]
  if q_document is not None:
    vis = vis & (q_document[:, :, None] == k_document[:, None, :])
  if mask_fn is not None:
    vis = vis & mask_fn(q_streams, k_streams)
  return vis[:, None]


def _block_logits(q, k, q_pos, k_pos, q_streams, k_streams, k_in_range, *, scale, bias_fn,
                  transform_fn):
  """Final pre-mask logits of one block: S + B, or transform(S, B), float32 [B, H, q, k]."""
  scores = attention_scores(q, k, scale)
  bias = None if bias_fn is None else bias_fn(q_streams, k_streams).astype(jnp.float32)
  if transform_fn is not None:
    return transform_fn(scores, bias, q_pos, k_pos, k_in_range).astype(jnp.float32)
  return scores if bias is None else scores + bias


def _check_streams(q_streams, k_streams):
  if (q_streams is None) != (k_streams is None):
    raise ValueError('q_streams and k_streams must be given together (or both None).')


def dense_attention(q_BxHxQxDh: jax.Array,
                    k_BxGxKxDh: jax.Array,
                    v_BxGxKxDh: jax.Array,
                    *,
                    q_pos: jax.Array,
                    k_pos: jax.Array,
                    q_streams: Any = None,
                    k_streams: Any = None,
                    bias_fn: Optional[BiasFn] = None,
                    transform_fn: Optional[TransformFn] = None,
                    k_valid: Optional[jax.Array] = None,
                    q_document: Optional[jax.Array] = None,
                    k_document: Optional[jax.Array] = None,
                    mask_fn: Optional[MaskFn] = None,
                    causal: bool = True,
                    scale: Optional[float] = None,
                    k_in_range: Optional[jax.Array] = None,
                    kernels: str = 'auto') -> jax.Array:
  """Attention over the full [Q, K] score matrix; returns [B, H, Q, Dh] in q's dtype.

  See the module docstring for the arguments. `k_in_range` [B, K] (default all True) tells a
  transform which keys are real; the model's KV cache uses it for slots past its length.
  Without a transform, the softmax core is the `kernels` path's (bipe_jax.kernels: 'auto' |
  'portable' | 'cpu').
  """
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  _check_shapes(q, k, v, q_pos, k_pos)
  _check_streams(q_streams, k_streams)
  if (q_document is None) != (k_document is None):
    raise ValueError('q_document and k_document must be given together.')
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  if q_streams is None:
    q_streams, k_streams = q_pos, k_pos
  vis = _visible(q_pos, k_pos, causal, k_valid, q_document, k_document, mask_fn, q_streams,
                 k_streams)
  if transform_fn is None:
    bias = None if bias_fn is None else bias_fn(q_streams, k_streams).astype(jnp.float32)
    core = kernels_lib.select(kernels).softmax_attention
    return core(q * jnp.asarray(scale, q.dtype), k, v, bias, vis).astype(q.dtype)
  if k_in_range is None:  # padding keys count as outside the row for a key-axis transform
    k_in_range = jnp.ones(k_pos.shape, bool) if k_valid is None else k_valid
  logits = _block_logits(q, k, q_pos, k_pos, q_streams, k_streams, k_in_range, scale=scale,
                         bias_fn=bias_fn, transform_fn=transform_fn)
  logits = jnp.where(vis, logits, NEG_INF)
  # The softmax does not depend on the shift m: stopping its gradient is exact and saves the
  # select-scatter that differentiating max costs over [B, H, Q, K].
  m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  p = jnp.where(vis, jnp.exp(logits - m), 0.0)
  denom = jnp.sum(p, axis=-1, keepdims=True)
  out = weighted_values(p, v) / jnp.where(denom == 0.0, 1.0, denom)
  return out.astype(q.dtype)


def _pad_axis(x, axis, before, after, value):
  if before == 0 and after == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (before, after)
  return jnp.pad(x, widths, constant_values=value)


def _slice(x, start, size, axis):
  return jax.lax.dynamic_slice_in_dim(x, start, size, axis=axis)


def blockwise_attention(q_BxHxQxDh: jax.Array,
                        k_BxGxKxDh: jax.Array,
                        v_BxGxKxDh: jax.Array,
                        *,
                        q_pos: jax.Array,
                        k_pos: jax.Array,
                        q_streams: Any = None,
                        k_streams: Any = None,
                        bias_fn: Optional[BiasFn] = None,
                        transform_fn: Optional[TransformFn] = None,
                        transform_halo: int = 0,
                        k_valid: Optional[jax.Array] = None,
                        q_document: Optional[jax.Array] = None,
                        k_document: Optional[jax.Array] = None,
                        mask_fn: Optional[MaskFn] = None,
                        causal: bool = True,
                        scale: Optional[float] = None,
                        block_size: int = 128,
                        checkpoint_blocks: bool = True) -> jax.Array:
  """Flash-style attention, equal to `dense_attention` (outputs and gradients, float32).

  Query blocks are a `lax.scan`; inside each, a `lax.scan` over key blocks keeps the running
  max / normaliser / weighted sum (online softmax) and skips, with `lax.cond`, every key block
  whose smallest causal index is above the largest query index of the block (about half the
  blocks for a causal square problem). Q and K need not be multiples of `block_size` (the tails
  are padded and masked); block sizes shrink to Q or K when those are smaller, and when both
  fit in one block this is `dense_attention` itself (measured faster there).

  Memory: the forward keeps one [B, H, bq, bk (+ 2 halo)] block alive, so it grows linearly in T.
  With `checkpoint_blocks` (default) each key-block step is rematerialised in the backward
  pass, so training stores only the per-step running statistics, not the block probabilities.

  `transform_halo`: see the module docstring (DAPE V2 needs 2 * (kernel // 2)).
  Returns [B, H, Q, Dh] in q's dtype.
  """
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  _check_shapes(q, k, v, q_pos, k_pos)
  _check_streams(q_streams, k_streams)
  if (q_document is None) != (k_document is None):
    raise ValueError('q_document and k_document must be given together.')
  if block_size <= 0:
    raise ValueError(f'block_size must be positive, got {block_size}.')
  if transform_halo < 0:
    raise ValueError(f'transform_halo must be >= 0, got {transform_halo}.')
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  if q.shape[2] <= block_size and k.shape[2] <= block_size:
    # One block: exactly the dense computation, without the scan / remat overhead.
    return dense_attention(q, k, v, q_pos=q_pos, k_pos=k_pos, q_streams=q_streams,
                           k_streams=k_streams, bias_fn=bias_fn, transform_fn=transform_fn,
                           k_valid=k_valid, q_document=q_document, k_document=k_document,
                           mask_fn=mask_fn, causal=causal, scale=scale)
  if q_streams is None:
    q_streams, k_streams = q_pos, k_pos
  b, h, nq_tok, d = q.shape
  nk_tok = k.shape[2]
  bq, bk = min(block_size, nq_tok), min(block_size, nk_tok)
  nqb, nkb = -(-nq_tok // bq), -(-nk_tok // bk)
  halo = transform_halo if transform_fn is not None else 0

  # Queries: pad the tail; padded rows see nothing and are cropped at the end.
  q_tail = nqb * bq - nq_tok
  q_p = _pad_axis(q, 2, 0, q_tail, 0)
  q_pos_p = _pad_axis(q_pos.astype(jnp.int32), 1, 0, q_tail, _QPOS_PAD)
  q_streams_p = jax.tree.map(lambda x: _pad_axis(x, 1, 0, q_tail, 0), q_streams)
  q_doc_p = None if q_document is None else _pad_axis(q_document, 1, 0, q_tail, -1)

  # Keys: `halo` on the left, halo + tail on the right; padded keys are out of range.
  k_tail = nkb * bk - nk_tok
  kpad = lambda x, value: _pad_axis(x, 1 if x.ndim < 4 else 2, halo, halo + k_tail, value)
  k_p, v_p = kpad(k, 0), kpad(v, 0)
  k_pos_p = kpad(k_pos.astype(jnp.int32), _POS_PAD)
  k_in_range_p = kpad(jnp.ones((b, nk_tok), bool), False)
  k_valid_p = k_in_range_p if k_valid is None else kpad(k_valid, False)
  k_streams_p = jax.tree.map(lambda x: _pad_axis(x, 1, halo, halo + k_tail, 0), k_streams)
  k_doc_p = None if k_document is None else kpad(k_document, -2)
  bk_ext = bk + 2 * halo

  def key_step(carry, j, q_blk, qpos_blk, qstr_blk, qdoc_blk):
    m, l, acc = carry
    start = j * bk

    def compute(carry):
      m, l, acc = carry
      sl = lambda x, axis=1: _slice(x, start, bk_ext, axis)
      kpos_ext = sl(k_pos_p)
      kstr_ext = jax.tree.map(sl, k_streams_p)
      logits = _block_logits(q_blk, sl(k_p, 2), qpos_blk, kpos_ext, qstr_blk, kstr_ext,
                             sl(k_valid_p), scale=scale, bias_fn=bias_fn,
                             transform_fn=transform_fn)
      crop = lambda x, axis: jax.lax.slice_in_dim(x, halo, halo + bk, axis=axis)
      logits = crop(logits, 3)
      kpos_blk = crop(kpos_ext, 1)
      kstr_blk = jax.tree.map(lambda x: crop(x, 1), kstr_ext)
      kdoc_blk = None if k_doc_p is None else crop(sl(k_doc_p), 1)
      vis = _visible(qpos_blk, kpos_blk, causal, crop(sl(k_valid_p), 1), qdoc_blk, kdoc_blk,
                     mask_fn, qstr_blk, kstr_blk)
      logits = jnp.where(vis, logits, NEG_INF)
      # The running max is only a numerical shift (the result is invariant to it): no gradient.
      m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(logits, axis=-1, keepdims=True)))
      p = jnp.where(vis, jnp.exp(logits - m_new), 0.0)
      corr = jnp.exp(m - m_new)
      l_new = corr * l + jnp.sum(p, axis=-1, keepdims=True)
      v_blk = _slice(v_p, start + halo, bk, 2)
      acc_new = corr * acc + weighted_values(p, v_blk)
      return m_new, l_new, acc_new

    if not causal:
      return compute(carry), None
    k_min = jnp.min(_slice(k_pos_p, start + halo, bk, 1))
    needed = k_min <= jnp.max(qpos_blk)
    return jax.lax.cond(needed, compute, lambda c: c, carry), None

  def query_step(_, i):
    q_blk = _slice(q_p, i * bq, bq, 2)
    qpos_blk = _slice(q_pos_p, i * bq, bq, 1)
    qstr_blk = jax.tree.map(lambda x: _slice(x, i * bq, bq, 1), q_streams_p)
    qdoc_blk = None if q_doc_p is None else _slice(q_doc_p, i * bq, bq, 1)
    step = functools.partial(key_step, q_blk=q_blk, qpos_blk=qpos_blk, qstr_blk=qstr_blk,
                             qdoc_blk=qdoc_blk)
    if checkpoint_blocks:
      step = jax.checkpoint(step)
    init = (jnp.full((b, h, bq, 1), NEG_INF, jnp.float32),
            jnp.zeros((b, h, bq, 1), jnp.float32),
            jnp.zeros((b, h, bq, d), jnp.float32))
    (_, l, acc), _ = jax.lax.scan(step, init, jnp.arange(nkb))
    out = acc / jnp.where(l == 0.0, 1.0, l)
    return None, out.astype(q.dtype)

  _, out_N = jax.lax.scan(query_step, None, jnp.arange(nqb))  # [nqb, B, H, bq, Dh]
  out = jnp.moveaxis(out_N, 0, 2).reshape(b, h, nqb * bq, d)
  return out[:, :, :nq_tok]


def fused_attention(q_BxHxQxDh: jax.Array,
                    k_BxGxKxDh: jax.Array,
                    v_BxGxKxDh: jax.Array,
                    *,
                    q_pos: jax.Array,
                    k_pos: jax.Array,
                    k_valid: Optional[jax.Array] = None,
                    q_document: Optional[jax.Array] = None,
                    k_document: Optional[jax.Array] = None,
                    causal: bool = True,
                    scale: Optional[float] = None,
                    plain_causal: bool = False,
                    key_bias_BxHx1xK: Optional[jax.Array] = None,
                    implementation: Optional[str] = None) -> jax.Array:
  """`jax.nn.dot_product_attention` in our layout and mask conventions (no bias_fn /
  transform; an optional per-key bias [B or 1, H, 1, K] added to every query's logits).

  `plain_causal=True` is the caller's promise that q_pos = k_pos = 0..T-1 in every row (the
  model's training forward): then, when no padding / document mask applies, the fused kernel
  gets `is_causal=True` and no [Q, K] mask is built. Otherwise an explicit boolean mask is built
  from the positions. `implementation`: None (XLA on CPU, cuDNN on GPU where it applies) |
  'xla' | 'cudnn'.
  """
  q, k, v = q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh
  _check_shapes(q, k, v, q_pos, k_pos)
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  to_bthd = lambda x: jnp.swapaxes(x, 1, 2)
  bias = None if key_bias_BxHx1xK is None else key_bias_BxHx1xK.astype(q.dtype)
  plain = (plain_causal and causal and k_valid is None and q_document is None and
           q.shape[2] == k.shape[2])
  if plain:
    out = jax.nn.dot_product_attention(to_bthd(q), to_bthd(k), to_bthd(v), bias=bias,
                                       scale=scale, is_causal=True,
                                       implementation=implementation)
  else:
    vis = _visible(q_pos, k_pos, causal, k_valid, q_document, k_document, None, None, None)
    out = jax.nn.dot_product_attention(to_bthd(q), to_bthd(k), to_bthd(v), bias=bias, mask=vis,
                                       scale=scale, implementation=implementation)
  return jnp.swapaxes(out, 1, 2)


def _fused_impl(impl: str, implementation: Optional[str]) -> Callable[..., jax.Array]:
  """attention_impl=`impl` ('fused' | 'cudnn'): `fused_attention` with `implementation`, after
  checking that no bias_fn, score transform or mask_fn is asked for (ValueError otherwise) and,
  for cuDNN, that the backend is a GPU."""

  def attend(q_BxHxQxDh: jax.Array, k_BxGxKxDh: jax.Array, v_BxGxKxDh: jax.Array, *,
             bias_fn: Optional[BiasFn] = None, transform_fn: Optional[TransformFn] = None,
             q_streams: Any = None, k_streams: Any = None, mask_fn: Optional[MaskFn] = None,
             **kwargs) -> jax.Array:
    del q_streams, k_streams
    if bias_fn is not None or transform_fn is not None or mask_fn is not None:
      raise ValueError(f"attention_impl={impl!r} supports no bias_fn, score transform or "
                       "mask_fn (encodings without bias, and the ALiBi family through a per-key "
                       "bias); use 'blockwise' or 'dense' for this encoding.")
    backend = jax.default_backend()
    if implementation == 'cudnn' and backend != 'gpu':
      raise ValueError(f"attention_impl='cudnn' needs a CUDA GPU, but the JAX backend is "
                       f"'{backend}'; use attention_impl='fused', 'blockwise' or 'dense'.")
    kwargs.pop('k_in_range', None)
    return fused_attention(q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh, implementation=implementation,
                           **kwargs)

  attend.__name__ = f'{impl}_attention'
  return attend


# attention_impl='fused': JAX's choice of implementation (XLA on CPU and TPU, cuDNN on GPU
# where it applies); 'cudnn': forced cuDNN, GPU only.
xla_fused_attention = _fused_impl('fused', None)
cudnn_attention = _fused_impl('cudnn', 'cudnn')


def attention_fn(impl: str) -> Callable[..., jax.Array]:
  """The attention function for `model.attention_impl` (see ATTENTION_IMPLS)."""
  impls = {'dense': dense_attention, 'blockwise': blockwise_attention,
           'cudnn': cudnn_attention, 'fused': xla_fused_attention}
  if impl not in impls:
    raise ValueError(f'attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}.')
  return impls[impl]
