"""Blockwise attention's flash-style backward pass (bipe_jax/attention/flash.py): gradients
equal dense attention's outside jit and for shapes / masks the jitted every-encoding test of
test_attention.py does not cover, and what the backward pass keeps is linear in T.

(test_attention.test_blockwise_equals_dense_outputs_and_grads compares the gradients w.r.t.
q, k, v and the bias / transform parameters for every bias kind, DAPE V1 / V2, GQA, padding
and documents, at a ragged length; test_model.test_blockwise_model_gradients_equal_dense does
it through the whole model, whose flax parameters the callbacks close over.)
"""

import math
import re

import chex
import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import attention as A
from tests.attention import test_attention as TA


def _grads(impl, q, k, v, params, name, **kw):
  """(output, d(loss)/d(q, k, v, params)) of `impl` with test_attention's case `name`."""
  bias_fn, transform_fn, halo, _, _ = TA._case(name)

  def loss(q, k, v, params):
    args = dict(kw)
    if bias_fn is not None:
      args['bias_fn'] = lambda qs, ks: bias_fn(params, qs, ks)
    if transform_fn is not None:
      args['transform_fn'] = lambda *a: transform_fn(params, *a)
    if impl == 'blockwise':
      args['transform_halo'] = halo
    out = A.attention_fn(impl)(q, k, v, **args)
    weights = jnp.sin(jnp.arange(out.size, dtype=jnp.float32)).reshape(out.shape)
    return jnp.sum(out * weights), out

  return jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, params)


def _assert_same(got, want):
  (_, out_b), grads_b = got
  (_, out_d), grads_d = want
  chex.assert_tree_all_finite((out_b, grads_b))
  np.testing.assert_allclose(out_b, out_d, atol=1e-5, rtol=1e-5)
  for gb, gd in zip(jax.tree.leaves(grads_b), jax.tree.leaves(grads_d)):
    chex.assert_equal_shape([gb, gd])
    np.testing.assert_allclose(gb, gd, atol=1e-5, rtol=1e-4)


def test_gradients_without_jit_dape_v2_documents_and_empty_rows():
  """Eager (no jit): DAPE V2 (halo keys across block edges) over Kerple, documents, and
  padding that leaves the first 3 queries of row 0 with no visible key."""
  t = 19
  q, k, v = TA._qkv(11, t, t)
  pos = TA._arange(t)
  valid = jnp.ones((TA.B, t), bool).at[0, :3].set(False).at[1, 9].set(False)
  doc = jnp.broadcast_to((jnp.arange(t) >= 11).astype(jnp.int32), (TA.B, t))
  kw = dict(mask=A.AttentionMask(q_pos=pos, k_pos=pos, k_valid=valid, q_document=doc,
                                 k_document=doc))
  params = TA._case('dape_v2_k3')[3]
  with jax.disable_jit():
    got = _grads('blockwise', q, k, v, params, 'dape_v2_k3', block_size=8, **kw)
  want = jax.jit(lambda *a: _grads('dense', *a, 'dape_v2_k3', **kw))(q, k, v, params)
  _assert_same(got, want)
  np.testing.assert_array_equal(got[0][1][0, :, :3], 0.0)
  assert float(jnp.max(jnp.abs(got[1][3]['dape']['w_in']))) > 0  # transform params learn


@pytest.mark.parametrize('name,q_len,k_len,offset,causal', [
    ('t5', 5, 30, 10, True),  # decode-like: queries at 10..14 against 30 keys
    ('dape_v1_kerple', 21, 21, 0, False),  # bidirectional with a sliding window
])
def test_gradients_query_offsets_and_non_causal(name, q_len, k_len, offset, causal):
  q, k, v = TA._qkv(12, q_len, k_len)
  window = lambda qs, ks: jnp.abs(qs[:, :, None] - ks[:, None, :]) <= 4
  kw = dict(mask=A.AttentionMask(q_pos=TA._arange(q_len, offset), k_pos=TA._arange(k_len),
                                 causal=causal, mask_fn=None if causal else window))
  params = TA._case(name)[3]
  fn = lambda impl, **extra: jax.jit(lambda *a: _grads(impl, *a, name, **kw, **extra))
  _assert_same(fn('blockwise', block_size=4)(q, k, v, params), fn('dense')(q, k, v, params))


_ITEM_BYTES = {'f32': 4, 'i32': 4, 'bool': 1, 'bf16': 2}


def _residual_bytes(t, blockwise_kw, capsys):
  """Total bytes that reverse-mode AD keeps from the forward to the backward pass of a
  Kerple-biased blockwise attention at length t (inputs included)."""
  bias_fn = TA._case('kerple')[0]
  params = TA._kerple_params(0)
  q, k, v = TA._qkv(13, t, t)
  pos = TA._arange(t)

  def loss(q, k, v, params):
    out = A.blockwise_attention(q, k, v, mask=A.AttentionMask.causal_from_positions(pos),
                                bias_fn=lambda qs, ks: bias_fn(params, qs, ks), **blockwise_kw)
    return jnp.sum(out)

  capsys.readouterr()
  jax.ad_checkpoint.print_saved_residuals(loss, q, k, v, params)
  total = 0
  for line in capsys.readouterr().out.strip().splitlines():  # e.g. 'f32[2,4,256,8] from ...'
    dtype, shape = re.match(r'(\w+)\[([\d,]*)\]', line).groups()
    total += _ITEM_BYTES[dtype] * math.prod(int(n) for n in shape.split(',') if n)
  return total


def test_saved_residuals_grow_linearly(capsys):
  """Doubling T doubles what the backward pass keeps (2.00x; the autodiff of the nested scans
  kept a running max per (query block, key block) pair: 2.45x here), and it is a few
  [B, H, T, Dh] arrays: q, k, v, the output, the log-sum-exp (plus the [B, T] positions and
  masks, which `_tied_to` makes residuals of each layer)."""
  kw = dict(block_size=16)
  small, large = _residual_bytes(128, kw, capsys), _residual_bytes(256, kw, capsys)
  assert large <= 2.05 * small, (small, large)
  qkv_bytes = 4 * TA.B * (TA.H + 2 * TA.G) * 256 * TA.DH
  side_bytes = 8 * 4 * TA.B * 256  # positions, streams and masks: a few [B, T] int32 / bool
  assert large <= 1.6 * qkv_bytes + side_bytes, (large, qkv_bytes)


def test_compiled_gradient_temporaries_grow_linearly():
  """XLA's buffer assignment for the gradient (q, k, v and the bias parameters): from 1k to
  4k tokens 2.15x (linear plus a constant; the autodiff of the nested scans: 4.71x here,
  tending to 16x)."""
  bias_fn = TA._case('kerple')[0]

  def temp_bytes(t):
    spec = jax.ShapeDtypeStruct((1, 4, t, 16), jnp.float32)
    pos = jax.ShapeDtypeStruct((1, t), jnp.int32)
    params = {'p': jax.ShapeDtypeStruct((4,), jnp.float32),
              'a': jax.ShapeDtypeStruct((4,), jnp.float32)}

    def loss(q, k, v, params, pos):
      mask = A.AttentionMask.causal_from_positions(pos)
      return jnp.sum(A.blockwise_attention(q, k, v, mask=mask, block_size=64,
                                           bias_fn=lambda a, b: bias_fn(params, a, b)))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    return grad.lower(spec, spec, spec, params, pos).compile().memory_analysis(
    ).temp_size_in_bytes

  small, large = temp_bytes(1024), temp_bytes(4096)
  assert large <= 3.0 * small, (small, large)


def test_gradients_inside_a_scan_over_layers():
  """The custom VJP inside `lax.scan` (what `model.scan_layers` makes of the decoder), with
  positions, streams, documents and padding that the scan body closes over: the backward pass
  must not capture the body's tracers (it raised UnexpectedTracerError when the side arrays
  were closed over instead of passed), and gradients equal dense attention's."""
  t = 37
  q, k, v = TA._qkv(5, t, t)
  pos = TA._arange(t)
  valid = jnp.ones((TA.B, t), bool).at[1, 20].set(False)
  doc = jnp.broadcast_to((jnp.arange(t) >= 17).astype(jnp.int32), (TA.B, t))
  bias_fn, _, _, params, _ = TA._case('kerple')

  def two_layers(impl, q, params):
    def layer(x, _):
      out = A.attention_fn(impl)(
          x, k, v, mask=A.AttentionMask(q_pos=pos, k_pos=pos, k_valid=valid, q_document=doc,
                                        k_document=doc),
          bias_fn=lambda qs, ks: bias_fn(params, qs, ks),
          **(dict(block_size=8) if impl == 'blockwise' else {}))
      return x + out, None
    return jnp.sum(jnp.sin(jax.lax.scan(layer, q, None, length=2)[0]))

  got = jax.jit(jax.grad(lambda *a: two_layers('blockwise', *a), argnums=(0, 1)))(q, params)
  want = jax.jit(jax.grad(lambda *a: two_layers('dense', *a), argnums=(0, 1)))(q, params)
  for gb, gd in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(gb, gd, atol=1e-5, rtol=1e-4)


def test_compiled_gradient_temporaries_grow_linearly_inside_a_scan_over_layers():
  """Layers scanned (`model.scan_layers`), positions closed over by the scan body: from 1k to
  4k tokens the gradient's temporaries stay linear (without `_tied_to` JAX moved the
  position-only work of every block pair out of the loop: quadratic)."""

  def temp_bytes(t):
    spec = jax.ShapeDtypeStruct((1, 4, t, 16), jnp.float32)
    pos = jnp.arange(t, dtype=jnp.int32)[None]

    def loss(q):
      def layer(x, _):
        return x + A.blockwise_attention(x, x * 0.5, x * 0.25,
                                         mask=A.AttentionMask.causal_from_positions(pos),
                                         block_size=64), None
      return jnp.sum(jax.lax.scan(layer, q, None, length=2)[0])

    return jax.jit(jax.grad(loss)).lower(spec).compile().memory_analysis().temp_size_in_bytes

  small, large = temp_bytes(1024), temp_bytes(4096)
  assert large <= 5.0 * small, (small, large)
