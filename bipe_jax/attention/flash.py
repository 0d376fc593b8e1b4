"""Blockwise attention with a flash-style backward pass: training memory linear in T.

`flash_blockwise_attention` is the body of `attention.blockwise_attention` for problems larger
than one block (same arguments and contract: see core.py's module docstring).

Forward. Query blocks are a `lax.scan`; inside each, a `lax.scan` over key blocks keeps the
running max / normaliser / weighted sum (online softmax) and skips, with `lax.cond`, every key
block whose smallest causal index is above the largest query index of the block. Biases and
transforms are evaluated per block from position slices, so no [T, T] array is ever built.

Backward (`jax.custom_vjp`). The forward saves only its inputs (q, k, v padded to whole
blocks, the bias / transform parameters), the output O [B, H, T, Dh] and the per-row
log-sum-exp L [B, H, T, 1] of the final logits. The backward runs the same two scans (same
causal block skipping) and recomputes, per block, the logits X (scores, bias, DAPE transform)
with `jax.vjp`; with P = exp(X - L) on visible pairs and D = rowsum(dO * O):
  dV += P^T dO,   dX = P * (dO V^T - D),   (dQ, dK, dparams) += vjp_X(dX),
dK of a block covering its transform halo (DAPE V2: the 2 * (kernel // 2) neighbouring keys on
each side, whose scores feed the block's convolution). dK, dV and the parameter gradients are
float32 carries of the outer scan, dQ of the inner one: everything the backward keeps is
O(T), whatever the encoding.

What plain autodiff through the nested scans kept instead (measured with
`jax.ad_checkpoint.print_saved_residuals` on the scan version this replaced, which
rematerialised each key-block step with `jax.checkpoint`): per (query block, key block) pair
the running row max m [B, H, bq, 1] (stacked [nqb, nkb, B, H, bq, 1] = B*H*T*(T/bk) floats)
and the lax.cond predicate, plus per query block its carries. That is quadratic in T
(the running sum and normaliser are not needed by the backward of the online softmax, the
max is): an attention-only gradient at H=4, Dh=16, block 128 needed 3.1 / 5.0 / 10.1 /
23.3 MiB of XLA temporaries at 1k / 2k / 4k / 8k tokens (benchmarks/README.md, section
"Long-context training memory", has the whole training step).

Parameters. `bias_fn` / `transform_fn` close over their parameters (the model builds them with
`model._pure`); `jax.closure_convert` hoists every closed-over float value that may carry a
gradient into an explicit argument of the custom VJP, so the public callback signatures stay
as they are and the gradients of ALiBi-free biases (Kerple p / a, FIRE's MLP, T5's table,
DAPE's weights) flow through the recomputed blocks.

Costing. Inside `loop_unroll.unrolled()` (the TPU cost model's programs,
compile/step_cost.py) the three scans are traced fully unrolled, so every block is costed;
training traces them as loops.

Float streams. Leaves of q_streams / k_streams with a floating dtype (FoX's cumulative log
forget gates c [B, T, H], encodings/fox.py) are activations: they travel as a differentiable
argument of the custom VJP, sliced per block like the integer streams, and their cotangents
are accumulated block by block (query side beside dQ, key side beside dK; O(T)).
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from bipe_jax.attention import blocks
from bipe_jax.attention.mask import AttentionMask
from bipe_jax.kernels.gqa_products import NEG_INF
from bipe_jax import loop_unroll

_F32 = jnp.float32


def _grouped(x_BxHxQxN, g):
  """[B, H, Q, N] -> [B, G, (H / G) * Q, N]: a GQA group's query heads merged into rows."""
  b, h, nq, n = x_BxHxQxN.shape
  return x_BxHxQxN.reshape(b, g, (h // g) * nq, n)


def _add_at(acc, update, start, axis):
  """acc with `update` added on [start, start + len) along `axis` (float32 accumulators)."""
  size = update.shape[axis]
  old = jax.lax.dynamic_slice_in_dim(acc, start, size, axis=axis)
  return jax.lax.dynamic_update_slice_in_dim(acc, old + update.astype(acc.dtype), start, axis)


def _tree_add(a, b):
  return jax.tree.map(lambda x, y: x + y.astype(x.dtype), a, b)


def _tied_to(q: jax.Array, x: jax.Array) -> jax.Array:
  """x unchanged, but computed from q (plus an exact zero).

  Inside a scan over layers (`model.scan_layers`) the positions and masks are the same in every
  layer. Differentiating the scan, JAX then treats everything computed from them alone as loop
  invariant and moves it out of the loop for every (query block, key block) pair at once: the
  compiled temporaries grew quadratically in T (benchmarks/flash_in_scan_memory.py: 785 -> 2849
  MiB from 4k to 8k tokens, against 37 -> 61 unrolled). A zero that depends on q keeps that work
  inside the loop, block by block.
  """
  zero = 0 * jax.lax.convert_element_type(jax.lax.stop_gradient(q.reshape(-1)[0]), jnp.int32)
  if x.dtype == jnp.bool_:
    return x & (zero == 0)
  return x + zero.astype(x.dtype)


def _split_floats(tree):
  """(the tree's leaves with the floating ones replaced by None, the floating leaves, treedef)."""
  leaves, treedef = jax.tree.flatten(tree)
  floating = [jnp.issubdtype(x.dtype, jnp.floating) for x in leaves]
  others = [None if f else x for x, f in zip(leaves, floating)]
  return others, [x for x, f in zip(leaves, floating) if f], treedef


def _merge_floats(others, floats, treedef):
  """The inverse of `_split_floats`: the pytree with the floating leaves put back."""
  floats = iter(floats)
  return jax.tree.unflatten(treedef, [next(floats) if x is None else x for x in others])


def flash_blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mask: AttentionMask,
                              q_streams: Any, k_streams: Any, bias_fn, transform_fn,
                              transform_halo: int, scale: float, block_size: int,
                              block_prune=None) -> jax.Array:
  """Blockwise attention [B, H, Q, Dh] (q's dtype) with the linear-memory backward.

  Arguments are those of `attention.blockwise_attention`, already checked; q_streams /
  k_streams are not None (the caller substitutes the positions). `block_prune`: None, or
  (threshold_fn(q, k) -> scalar, bound_fn(q_streams_blk, k_streams_blk) -> scalar): a key block
  whose bias bound is below the threshold is skipped in both passes (FoX's pruning,
  encodings/fox.py).
  """
  b, h, nq_tok, d = q.shape
  g, nk_tok = k.shape[1], k.shape[2]
  bq, bk = min(block_size, nq_tok), min(block_size, nk_tok)
  nqb, nkb = -(-nq_tok // bq), -(-nk_tok // bk)
  halo = transform_halo if transform_fn is not None else 0
  bk_ext = bk + 2 * halo

  # Queries: pad the tail; padded rows see nothing and are cropped at the end.
  q_tail = nqb * bq - nq_tok
  q_p = blocks.pad_axis(q, 2, 0, q_tail, 0)
  q_streams_p = jax.tree.map(lambda x: blocks.pad_axis(x, 1, 0, q_tail, 0), q_streams)

  # Keys: `halo` on the left, halo + tail on the right; padded keys are out of range.
  k_tail = nkb * bk - nk_tok
  k_p, v_p = (blocks.pad_axis(x, 2, halo, halo + k_tail, 0) for x in (k, v))
  k_streams_p = jax.tree.map(lambda x: blocks.pad_axis(x, 1, halo, halo + k_tail, 0), k_streams)
  mask_p = mask.pad(q_tail, halo, halo + k_tail)

  # The mask and streams travel as explicit (non-differentiated) arguments of the custom VJP
  # below, never as closed-over values: closed-over tracers of an enclosing transformation
  # (nn.scan over layers, shard_map) would leak into the backward pass. Float streams are
  # differentiable inputs (`fs`); the side keeps the others.
  q_other, q_floats, q_def = _split_floats(q_streams_p)
  k_other, k_floats, k_def = _split_floats(k_streams_p)
  side = dict(mask=mask_p, q_streams=q_other, k_streams=k_other)
  side = jax.tree.map(functools.partial(_tied_to, q_p), side)
  fs = jax.tree.map(functools.partial(_tied_to, q_p), dict(q=q_floats, k=k_floats))

  def q_block(side, i, q_fl):
    """Query block i: its mask (over all keys) and streams, with its slices `q_fl` of the
    float streams."""
    sl = lambda x: blocks.slice_block(x, i * bq, bq, 1)
    streams = _merge_floats(jax.tree.map(sl, side['q_streams']), q_fl, q_def)
    return dict(mask=side['mask'].slice_queries(i * bq, bq), streams=streams)

  def k_block(side, qs, j, k_fl_ext):
    """Key block j against query block `qs`: widened by the halo ('_ext') and cropped;
    `k_fl_ext` are the float streams' slices over the widened block."""
    ext = lambda x: blocks.slice_block(x, j * bk, bk_ext, 1)
    crop = lambda x: jax.lax.slice_in_dim(x, halo, halo + bk, axis=1)
    streams_ext = _merge_floats(jax.tree.map(ext, side['k_streams']), k_fl_ext, k_def)
    return dict(mask_ext=qs['mask'].slice_keys(j * bk, bk_ext), streams_ext=streams_ext,
                mask=qs['mask'].slice_keys(j * bk + halo, bk),
                streams=jax.tree.map(crop, streams_ext))

  q_fl_of = lambda fs, i: [blocks.slice_block(x, i * bq, bq, 1) for x in fs['q']]
  k_fl_of = lambda fs, j: [blocks.slice_block(x, j * bk, bk_ext, 1) for x in fs['k']]

  def logits_of(q_blk, k_ext, qs, ks, *params):
    """Pre-mask logits of one block, cropped to its bk keys: float32 [B, H, bq, bk]."""
    logits = blocks.block_logits(q_blk, k_ext, ks['mask_ext'], qs['streams'], ks['streams_ext'],
                                 scale=scale, bias_fn=bias_fn, transform_fn=transform_fn)
    return jax.lax.slice_in_dim(logits, halo, halo + bk, axis=3)

  # Hoist the parameters bias_fn / transform_fn close over into explicit arguments.
  qs0 = q_block(side, 0, q_fl_of(fs, 0))
  example = (blocks.slice_block(q_p, 0, bq, 2), blocks.slice_block(k_p, 0, bk_ext, 2), qs0,
             k_block(side, qs0, 0, k_fl_of(fs, 0)))
  block_logits, params = jax.closure_convert(logits_of, *example)

  def visible(qs, ks):
    return ks['mask'].visible(qs['streams'], ks['streams'])

  def key_blocks(side, fs, step, carry, qs, threshold):
    """Scans `step(carry, j, ks)` over the key blocks, skipping those above the diagonal (and
    those `block_prune` prunes: bound < threshold)."""

    def body(carry, j):
      ks = k_block(side, qs, j, k_fl_of(fs, j))
      if not mask.causal and block_prune is None:
        return step(carry, j, ks), None
      needed = ks['mask'].may_see_any()
      if block_prune is not None:
        needed = needed & (block_prune[1](qs['streams'], ks['streams']) >= threshold)
      return jax.lax.cond(needed, lambda c: step(c, j, ks), lambda c: c, carry), None

    return jax.lax.scan(body, carry, jnp.arange(nkb), unroll=loop_unroll.scan_unroll())[0]

  threshold_of = lambda q_p, k_p: None if block_prune is None else block_prune[0](q_p, k_p)

  def forward(q_p, k_p, v_p, params, fs, side):
    """(output [B, H, nqb * bq, Dh] in q's dtype, log-sum-exp [B, H, nqb * bq, 1] float32)."""
    threshold = threshold_of(q_p, k_p)

    def query_step(_, i):
      q_blk, qs = blocks.slice_block(q_p, i * bq, bq, 2), q_block(side, i, q_fl_of(fs, i))

      def step(carry, j, ks):
        m, l, acc = carry
        logits = block_logits(q_blk, blocks.slice_block(k_p, j * bk, bk_ext, 2), qs, ks, *params)
        vis = visible(qs, ks)
        logits = jnp.where(vis, logits, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(logits, axis=-1, keepdims=True))
        p = jnp.where(vis, jnp.exp(logits - m_new), 0.0)
        corr = jnp.exp(m - m_new)
        v_blk = blocks.slice_block(v_p, j * bk + halo, bk, 2)
        pv = jnp.einsum('bgxk,bgkd->bgxd', _grouped(p, g).astype(v_p.dtype), v_blk,
                        preferred_element_type=_F32).reshape(acc.shape)
        return m_new, corr * l + jnp.sum(p, axis=-1, keepdims=True), corr * acc + pv

      init = (jnp.full((b, h, bq, 1), NEG_INF, _F32), jnp.zeros((b, h, bq, 1), _F32),
              jnp.zeros((b, h, bq, d), _F32))
      m, l, acc = key_blocks(side, fs, step, init, qs, threshold)
      seen = l > 0.0  # rows with no visible key: output 0, log-sum-exp 0 (never used)
      out = acc / jnp.where(seen, l, 1.0)
      lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
      return None, (out.astype(q_p.dtype), lse)

    _, (out_N, lse_N) = jax.lax.scan(query_step, None, jnp.arange(nqb),
                                     unroll=loop_unroll.scan_unroll())
    unblock = lambda x: jnp.moveaxis(x, 0, 2).reshape(b, h, nqb * bq, x.shape[-1])
    return unblock(out_N), unblock(lse_N)

  def backward(q_p, k_p, v_p, params, fs, side, out_p, lse_p, d_out_p):
    """(dQ, dK, dV, dparams, dfs) from the saved output and log-sum-exp; blocks recomputed."""
    delta_p = jnp.sum(d_out_p.astype(_F32) * out_p.astype(_F32), axis=-1, keepdims=True)
    threshold = threshold_of(q_p, k_p)

    def query_step(carry, i):
      sl = lambda x: blocks.slice_block(x, i * bq, bq, 2)
      q_blk, q_fl = sl(q_p), q_fl_of(fs, i)
      qs = q_block(side, i, q_fl)
      d_out_blk, lse_blk, delta_blk = sl(d_out_p), sl(lse_p), sl(delta_p)
      d_out_g = _grouped(d_out_blk.astype(v_p.dtype), g)

      def step(carry, j, ks):
        d_q, d_q_fl, d_k, d_v, d_params, d_k_fl = carry
        k_ext = blocks.slice_block(k_p, j * bk, bk_ext, 2)
        def logits_fn(q_, k_, p_, qf_, kf_):
          qs_ = q_block(side, i, qf_)
          return block_logits(q_, k_, qs_, k_block(side, qs_, j, kf_), *p_)
        logits, logits_vjp = jax.vjp(logits_fn, q_blk, k_ext, params, q_fl, k_fl_of(fs, j))
        vis = visible(qs, ks)
        p = jnp.where(vis, jnp.exp(jnp.where(vis, logits, NEG_INF) - lse_blk), 0.0)
        v_blk = blocks.slice_block(v_p, j * bk + halo, bk, 2)
        p_g = _grouped(p, g).astype(v_p.dtype)
        d_v_blk = jnp.einsum('bgxk,bgxd->bgkd', p_g, d_out_g, preferred_element_type=_F32)
        d_p = jnp.einsum('bgxd,bgkd->bgxk', d_out_g, v_blk, preferred_element_type=_F32)
        d_logits = p * (d_p.reshape(p.shape) - delta_blk)  # zero where not visible
        dq_blk, dk_ext, dparams_blk, dq_fl, dk_fl_ext = logits_vjp(d_logits)
        return (d_q + dq_blk.astype(_F32), _tree_add(d_q_fl, dq_fl),
                _add_at(d_k, dk_ext, j * bk, 2), _add_at(d_v, d_v_blk, j * bk + halo, 2),
                _tree_add(d_params, dparams_blk),
                [_add_at(a, u, j * bk, 1) for a, u in zip(d_k_fl, dk_fl_ext)])

      d_k, d_v, d_params, d_k_fl = carry
      zeros_q_fl = [jnp.zeros(x.shape, _F32) for x in q_fl]
      d_q, d_q_fl, d_k, d_v, d_params, d_k_fl = key_blocks(
          side, fs, step,
          (jnp.zeros(q_blk.shape, _F32), zeros_q_fl, d_k, d_v, d_params, d_k_fl), qs, threshold)
      return (d_k, d_v, d_params, d_k_fl), (d_q, d_q_fl)

    init = (jnp.zeros(k_p.shape, _F32), jnp.zeros(v_p.shape, _F32),
            jax.tree.map(jnp.zeros_like, params), [jnp.zeros(x.shape, _F32) for x in fs['k']])
    (d_k, d_v, d_params, d_k_fl), (d_q_N, d_q_fl_N) = jax.lax.scan(
        query_step, init, jnp.arange(nqb), unroll=loop_unroll.scan_unroll())
    d_q = jnp.moveaxis(d_q_N, 0, 2).reshape(q_p.shape)
    # [nqb, B, bq, ...] -> [B, nqb * bq, ...]
    unblock_fl = lambda x, like: jnp.moveaxis(x, 0, 1).reshape(like.shape).astype(like.dtype)
    d_fs = dict(q=[unblock_fl(x, like) for x, like in zip(d_q_fl_N, fs['q'])],
                k=[x.astype(like.dtype) for x, like in zip(d_k_fl, fs['k'])])
    no_side_cotangents = jax.tree.map(lambda _: None, side)
    return (d_q.astype(q_p.dtype), d_k.astype(k_p.dtype), d_v.astype(v_p.dtype), d_params,
            d_fs, no_side_cotangents)

  @jax.custom_vjp
  def attend(q_p, k_p, v_p, params, fs, side):
    return forward(q_p, k_p, v_p, params, fs, side)[0]

  def attend_fwd(q_p, k_p, v_p, params, fs, side):
    out_p, lse_p = forward(q_p, k_p, v_p, params, fs, side)
    return out_p, (q_p, k_p, v_p, params, fs, side, out_p, lse_p)

  def attend_bwd(residuals, d_out_p):
    return backward(*residuals, d_out_p)

  attend.defvjp(attend_fwd, attend_bwd)
  out_p = attend(q_p, k_p, v_p, params, fs, side)
  return out_p[:, :, :nq_tok]
