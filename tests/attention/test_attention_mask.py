"""`AttentionMask` (bipe_jax/attention/mask.py): visibility against a loop-based NumPy reference
(causal, padding, documents, a mask_fn; jit and eager), the flash path's padded / sliced blocks,
the causal block skip, its pytree shape and its one-line errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import attention as A

B, Q, K = 2, 5, 9
_RNG = np.random.default_rng(0)
Q_POS = np.stack([np.arange(4, 4 + Q), np.arange(2, 2 + Q)]).astype(np.int32)  # decode-like
K_POS = np.broadcast_to(np.arange(K, dtype=np.int32), (B, K))
K_VALID = _RNG.random((B, K)) > 0.25
Q_DOC = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 2]], np.int32)
K_DOC = np.array([[0] * 5 + [1] * 4, [0] * 3 + [1] * 5 + [2]], np.int32)
STREAMS_Q, STREAMS_K = Q_POS * 3, K_POS * 3  # a stream the mask_fn reads (not the positions)


def _window(qs, ks):
  return jnp.abs(qs[:, :, None] - ks[:, None, :]) <= 6


def _reference(causal, valid, docs, window):
  """bool [B, Q, K], pair by pair."""
  out = np.zeros((B, Q, K), bool)
  for b in range(B):
    for i in range(Q):
      for j in range(K):
        ok = not causal or K_POS[b, j] <= Q_POS[b, i]
        ok = ok and (not valid or bool(K_VALID[b, j]))
        ok = ok and (not docs or Q_DOC[b, i] == K_DOC[b, j])
        ok = ok and (not window or abs(STREAMS_Q[b, i] - STREAMS_K[b, j]) <= 6)
        out[b, i, j] = ok
  return out


def _mask(causal, valid, docs, window):
  return A.AttentionMask(q_pos=jnp.asarray(Q_POS), k_pos=jnp.asarray(K_POS),
                         k_valid=jnp.asarray(K_VALID) if valid else None,
                         q_document=jnp.asarray(Q_DOC) if docs else None,
                         k_document=jnp.asarray(K_DOC) if docs else None, causal=causal,
                         mask_fn=_window if window else None)


@pytest.mark.parametrize('jit', [False, True], ids=['eager', 'jit'])
@pytest.mark.parametrize('causal,valid,docs,window', [
    (True, False, False, False), (False, False, False, False), (True, True, False, False),
    (True, False, True, False), (False, False, False, True), (True, True, True, True)])
def test_visible_equals_the_loop_reference(causal, valid, docs, window, jit):
  mask = _mask(causal, valid, docs, window)
  vis = lambda m, qs, ks: m.visible(qs, ks)
  got = (jax.jit(vis) if jit else vis)(mask, jnp.asarray(STREAMS_Q), jnp.asarray(STREAMS_K))
  chex.assert_shape(got, (B, 1, Q, K))
  want = _reference(causal, valid, docs, window)
  np.testing.assert_array_equal(np.asarray(got)[:, 0], want)
  assert want.any() and want.all() == (not (causal or valid or docs or window))  # not vacuous


def test_padded_and_sliced_blocks_equal_the_reference_block():
  """What the flash path does: pad (queries after, keys on both sides), then cut a block."""
  mask = _mask(True, True, True, True)
  pad = lambda x, before, after: jnp.pad(jnp.asarray(x), ((0, 0), (before, after)))
  padded = mask.pad(3, 2, 1)
  chex.assert_shape((padded.q_pos, padded.q_document), (B, Q + 3))
  chex.assert_shape((padded.k_pos, padded.k_valid, padded.k_document), (B, K + 3))
  qs_p, ks_p = pad(STREAMS_Q, 0, 3), pad(STREAMS_K, 2, 1)
  full = np.asarray(padded.visible(qs_p, ks_p))[:, 0]
  want = _reference(True, True, True, True)
  np.testing.assert_array_equal(full[:, :Q, 2:2 + K], want)
  assert not full[:, Q:].any() and not full[:, :, :2].any() and not full[:, :, -1].any()

  def block(m, i, j):  # query rows [i, i + 4), key columns [j, j + 3) (traced starts)
    blk = m.slice_queries(i, 4).slice_keys(j, 3)
    return blk.visible(jax.lax.dynamic_slice_in_dim(qs_p, i, 4, 1),
                       jax.lax.dynamic_slice_in_dim(ks_p, j, 3, 1))

  got = jax.jit(block)(padded, 1, 4)
  np.testing.assert_array_equal(np.asarray(got)[:, 0], full[:, 1:5, 4:7])


def test_no_padding_materialises_k_valid_and_keys_in_range():
  mask = A.AttentionMask.causal_from_positions(jnp.asarray(Q_POS), jnp.asarray(K_POS))
  np.testing.assert_array_equal(mask.keys_in_range(), np.ones((B, K), bool))
  padded = mask.pad(0, 1, 0)
  np.testing.assert_array_equal(padded.keys_in_range()[:, 0], False)
  np.testing.assert_array_equal(padded.keys_in_range()[:, 1:], True)


def test_may_see_any_is_the_causal_block_skip():
  pos = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (B, 8))
  mask = A.AttentionMask.causal_from_positions(pos)
  assert bool(mask.slice_queries(4, 4).slice_keys(4, 4).may_see_any())  # the diagonal block
  assert not bool(mask.slice_queries(0, 4).slice_keys(4, 4).may_see_any())  # above it
  bidirectional = A.AttentionMask(q_pos=pos, k_pos=pos, causal=False)
  assert bool(bidirectional.slice_queries(0, 4).slice_keys(4, 4).may_see_any())


def test_a_pytree_with_static_causal_and_mask_fn():
  mask = _mask(False, True, False, True)
  assert len(jax.tree.leaves(mask)) == 3  # q_pos, k_pos, k_valid
  moved = jax.tree.map(lambda x: x + 0, mask)
  assert moved.causal is False and moved.mask_fn is _window
  assert mask.only_causal is False
  assert A.AttentionMask.causal_from_positions(jnp.asarray(Q_POS)).only_causal


def test_errors_name_the_field():
  pos = jnp.zeros((B, Q), jnp.int32)
  with pytest.raises(ValueError, match=r'q_pos must be \[B, Q\]=\(2, 5\) and k_pos'):
    A.AttentionMask.causal_from_positions(pos).check(B, Q, K)
  with pytest.raises(ValueError, match='q_document and k_document must be given together'):
    A.AttentionMask(q_pos=pos, k_pos=pos, q_document=pos).check(B, Q, Q)
  with pytest.raises(ValueError, match=r'k_valid must be \(2, 5\); got \(1, 5\)'):
    A.AttentionMask(q_pos=pos, k_pos=pos, k_valid=jnp.ones((1, Q), bool)).check(B, Q, Q)
  q = jnp.zeros((B, 2, Q, 4))
  windowed = A.AttentionMask(q_pos=pos, k_pos=pos, mask_fn=_window)
  with pytest.raises(ValueError, match='mask_fn'):
    A.fused_attention(q, q, q, mask=windowed)
