"""Dense and blockwise attention: a loop NumPy reference, blockwise == dense (outputs and
gradients) for every kind of bias / transform, masks, GQA, ragged lengths and memory growth."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import attention as A
from bipe_jax.encodings import alibi
from bipe_jax.encodings import dape
from bipe_jax.encodings import fire
from bipe_jax.encodings import kerple
from bipe_jax.encodings import t5

B, H, G, DH = 2, 4, 2, 8


def _qkv(seed, q_len, k_len, h=H, g=G, dh=DH):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return (jax.random.normal(ks[0], (B, h, q_len, dh)),
          jax.random.normal(ks[1], (B, g, k_len, dh)),
          jax.random.normal(ks[2], (B, g, k_len, dh)))


def _arange(n, offset=0):
  return jnp.broadcast_to(jnp.arange(offset, offset + n, dtype=jnp.int32), (B, n))


def _reference(q, k, v, q_pos, k_pos, bias=None, k_valid=None, q_doc=None, k_doc=None):
  """Loop-based NumPy attention (float64), causal by position, GQA by h // (H // G)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b_, h_, nq, dh = q.shape
  g_, nk = k.shape[1], k.shape[2]
  out = np.zeros_like(q)
  for b in range(b_):
    for h in range(h_):
      g = h // (h_ // g_)
      for i in range(nq):
        logits, keep = [], []
        for j in range(nk):
          s = float(np.dot(q[b, h, i], k[b, g, j])) / math.sqrt(dh)
          if bias is not None:
            s += float(bias[b if bias.shape[0] > 1 else 0, h, i, j])
          ok = k_pos[b, j] <= q_pos[b, i]
          ok = ok and (k_valid is None or bool(k_valid[b, j]))
          ok = ok and (q_doc is None or q_doc[b, i] == k_doc[b, j])
          logits.append(s)
          keep.append(ok)
        if not any(keep):
          continue
        m = max(s for s, ok in zip(logits, keep) if ok)
        w = np.array([math.exp(s - m) if ok else 0.0 for s, ok in zip(logits, keep)])
        out[b, h, i] = (w / w.sum()) @ v[b, g]
  return out


def test_dense_matches_loop_reference_with_bias_and_masks():
  t = 11
  q, k, v = _qkv(0, t, t)
  pos = np.asarray(_arange(t))
  slopes = alibi.alibi_slopes(H)
  valid = np.ones((B, t), bool)
  valid[1, 2] = False
  doc = np.broadcast_to((np.arange(t) >= 6).astype(np.int32), (B, t))
  bias_fn = lambda qp, kp: alibi.alibi_bias(qp, kp, slopes)
  bias = np.asarray(bias_fn(pos, pos))
  out = jax.jit(lambda q, k, v: A.dense_attention(
      q, k, v, mask=A.AttentionMask(q_pos=pos, k_pos=pos, k_valid=valid, q_document=doc,
                                    k_document=doc), bias_fn=bias_fn))(q, k, v)
  chex.assert_shape(out, (B, H, t, DH))
  ref = _reference(q, k, v, pos, pos, bias, valid, doc, doc)
  np.testing.assert_allclose(out, ref, atol=1e-5)


def test_dense_decode_shape_query_offset():
  """One query row at offset 6 against 9 cached keys: keys 7, 8 are invisible."""
  q, k, v = _qkv(1, 1, 9)
  q_pos, k_pos = _arange(1, offset=6), _arange(9)
  mask = A.AttentionMask.causal_from_positions(q_pos, k_pos)
  fn = jax.jit(lambda *a: A.dense_attention(*a, mask=mask))
  out = fn(q, k, v)
  np.testing.assert_allclose(out, _reference(q, k, v, q_pos, k_pos), atol=1e-5)
  # Changing the invisible keys changes nothing.
  out2 = fn(q, k.at[:, :, 7:].set(5.0), v.at[:, :, 7:].set(-3.0))
  np.testing.assert_allclose(out, out2, atol=1e-6)


def _inter_ids(seed, t):
  """Random non-decreasing segment ids [B, T] (an inter stream)."""
  rng = np.random.default_rng(seed)
  return jnp.asarray(np.cumsum(rng.random((B, t)) < 0.3, axis=1), jnp.int32)


def _kerple_params(seed):
  rng = np.random.default_rng(seed)
  return {'p': jnp.asarray(rng.uniform(0.1, 2, H), jnp.float32),
          'a': jnp.asarray(rng.uniform(0.1, 1, H), jnp.float32)}


def _rand(rng, *shape, scale=0.3):
  return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)


def _case(name):
  """(bias_fn(params, qs, ks), transform_fn(params, ...), halo, params, use_inter_streams)."""
  rng = np.random.default_rng(7)
  kerple_fn = lambda p, qs, ks: kerple.kerple_log_bias(qs, ks, p['p'], p['a'])
  if name == 'none':
    return None, None, 0, {}, False
  if name == 'alibi':
    return (lambda p, qs, ks: alibi.alibi_bias(qs, ks, alibi.alibi_slopes(H))), None, 0, {}, \
        False
  if name == 'bipe_alibi_x96':
    fn = lambda p, qs, ks: alibi.alibi_bias(qs, ks, alibi.alibi_slopes(H), slope_factor=96.)
    return fn, None, 0, {}, True
  if name in ('kerple', 'bipe_kerple'):
    return kerple_fn, None, 0, _kerple_params(0), name == 'bipe_kerple'
  if name == 'fire':
    params = dict(c=jnp.float32(0.1), l_multiplier=jnp.float32(1.0), w_in_1xN=_rand(rng, 1, 16),
                  b_in_N=_rand(rng, 16), w_out_NxH=_rand(rng, 16, H), b_out_H=_rand(rng, H))
    fn = lambda p, qs, ks: fire.fire_bias(qs, ks, init_L=16., **p)
    return fn, None, 0, params, False
  if name == 't5':
    fn = lambda p, qs, ks: t5.t5_bias(qs, ks, p['table'], num_buckets=8, max_distance=20)
    return fn, None, 0, {'table': _rand(rng, 8, H)}, False
  params = dict(_kerple_params(1))
  if name in ('dape_v1_kerple', 'bipe_dape_kerple'):
    params['dape'] = dict(w_in=_rand(rng, 2 * H, 16), b_in=_rand(rng, 16),
                          w_out=_rand(rng, 16, H), b_out=_rand(rng, H))
    tf = lambda p, s, b, qp, kp, inr: dape.dape_v1_transform(s, b, p['dape'])
    return kerple_fn, tf, 0, params, name == 'bipe_dape_kerple'
  if name.startswith('dape_v2_k'):
    ks = int(name[-1])
    params['dape'] = dict(w_in=_rand(rng, ks, 2 * H, 8), b_in=_rand(rng, 8),
                          w_out=_rand(rng, ks, 8, H), b_out=_rand(rng, H))
    tf = lambda p, s, b, qp, kp, inr: dape.dape_v2_transform(
        s, b, p['dape'], ks, q_pos_BxQ=qp, k_pos_BxK=kp, k_valid_BxK=inr)
    return kerple_fn, tf, dape.dapev2_halo(ks), params, False
  raise ValueError(name)


CASES = ('none', 'alibi', 'bipe_alibi_x96', 'kerple', 'bipe_kerple', 'fire', 't5',
         'dape_v1_kerple', 'bipe_dape_kerple', 'dape_v2_k3', 'dape_v2_k5')


def _loss_fn(impl, name, t, block_size, masks):
  bias_fn, transform_fn, halo, _, use_inter = _case(name)
  pos = _arange(t)
  streams = _inter_ids(3, t) if use_inter else pos

  def loss(q, k, v, params):
    kw = dict(mask=A.AttentionMask(q_pos=pos, k_pos=pos, **masks), q_streams=streams,
              k_streams=streams)
    if bias_fn is not None:
      kw['bias_fn'] = lambda qs, ks: bias_fn(params, qs, ks)
    if transform_fn is not None:
      kw['transform_fn'] = lambda *a: transform_fn(params, *a)
    if impl == 'blockwise':
      kw.update(block_size=block_size, transform_halo=halo)
    out = A.attention_fn(impl)(q, k, v, **kw)
    weights = jnp.cos(jnp.arange(out.size, dtype=jnp.float32)).reshape(out.shape)
    return jnp.sum(out * weights), out

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))


@pytest.mark.parametrize('name', CASES)
def test_blockwise_equals_dense_outputs_and_grads(name):
  t = 37  # not a multiple of the block size: 5 blocks, the last one ragged
  q, k, v = _qkv(2, t, t)
  masks = {}
  if name in ('kerple', 'dape_v2_k3', 'dape_v1_kerple'):
    valid = jnp.ones((B, t), bool).at[0, 5].set(False).at[1, 20:23].set(False)
    doc = jnp.broadcast_to((jnp.arange(t) >= 17).astype(jnp.int32), (B, t))
    masks = dict(k_valid=valid, q_document=doc, k_document=doc)
  params = _case(name)[3]
  (_, out_d), grads_d = _loss_fn('dense', name, t, 8, masks)(q, k, v, params)
  (_, out_b), grads_b = _loss_fn('blockwise', name, t, 8, masks)(q, k, v, params)
  chex.assert_shape(out_b, (B, H, t, DH))
  chex.assert_tree_all_finite((out_b, grads_b))
  np.testing.assert_allclose(out_b, out_d, atol=1e-5, rtol=1e-5)
  for gd, gb in zip(jax.tree.leaves(grads_d), jax.tree.leaves(grads_b)):
    np.testing.assert_allclose(gb, gd, atol=1e-5, rtol=1e-4)
  if name in ('dape_v2_k3', 'kerple'):
    # The masked / biased output really differs from plain attention (the case is not vacuous).
    plain = A.dense_attention(q, k, v, mask=A.AttentionMask.causal_from_positions(_arange(t)))
    assert float(jnp.max(jnp.abs(plain - out_d))) > 1e-2


@pytest.mark.parametrize('q_len,k_len,offset,block', [(1, 23, 22, 8), (5, 30, 10, 8),
                                                      (9, 9, 0, 64)])
def test_blockwise_query_offsets_and_large_blocks(q_len, k_len, offset, block):
  """Decode-like shapes: queries at offset..offset+Q-1 against K keys; block > T."""
  q, k, v = _qkv(3, q_len, k_len)
  q_pos, k_pos = _arange(q_len, offset), _arange(k_len)
  bias_fn, tf, halo, params, _ = _case('dape_v2_k3')
  kw = dict(mask=A.AttentionMask.causal_from_positions(q_pos, k_pos),
            bias_fn=lambda a, b: bias_fn(params, a, b),
            transform_fn=lambda *a: tf(params, *a))
  dense = jax.jit(lambda *a: A.dense_attention(*a, **kw))(q, k, v)
  block = jax.jit(lambda *a: A.blockwise_attention(*a, block_size=block, transform_halo=halo,
                                                   **kw))(q, k, v)
  np.testing.assert_allclose(block, dense, atol=1e-5)


@pytest.mark.parametrize('causal', [True, False])
def test_mask_fn_and_non_causal(causal):
  """A sliding-window mask_fn (keys within 4 positions), causal or bidirectional."""
  t = 21
  q, k, v = _qkv(9, t, t)
  pos = _arange(t)
  window = lambda qs, ks: jnp.abs(qs[:, :, None] - ks[:, None, :]) <= 4
  kw = dict(mask=A.AttentionMask(q_pos=pos, k_pos=pos, mask_fn=window, causal=causal))
  dense = jax.jit(lambda *a: A.dense_attention(*a, **kw))(q, k, v)
  block = jax.jit(lambda *a: A.blockwise_attention(*a, block_size=8, **kw))(q, k, v)
  np.testing.assert_allclose(block, dense, atol=1e-5)
  # Reference: bidirectional window = the loop reference with "causal" positions that let
  # every key within the window through.
  qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
  ref = np.zeros_like(qn)
  for b in range(B):
    for h in range(H):
      for i in range(t):
        js = [j for j in range(t) if abs(i - j) <= 4 and (j <= i or not causal)]
        s = np.array([qn[b, h, i] @ kn[b, h // 2, j] for j in js]) / math.sqrt(DH)
        w = np.exp(s - s.max())
        ref[b, h, i] = (w / w.sum()) @ vn[b, h // 2, js]
  np.testing.assert_allclose(dense, ref, atol=1e-5)


@pytest.mark.parametrize('kernels', ['cpu', 'portable'])
@pytest.mark.parametrize('with_bias', [False, True])
def test_dense_gradients_equal_autodiff_of_the_plain_formula(with_bias, kernels):
  """dense_attention's softmax core on each kernels path (cpu: the hand-written backward of
  kernels/cpu_attention.py; portable: jax.nn.dot_product_attention) against automatic
  differentiation of softmax(q.k / sqrt(Dh) + bias, masked) @ v with the KV heads repeated;
  GQA, padding keys and a fully masked row included."""
  t = 11
  q, k, v = _qkv(9, t, t)
  pos = _arange(t)
  valid = jnp.ones((B, t), bool).at[0, :3].set(False).at[1, 6].set(False)
  bias0 = jax.random.normal(jax.random.PRNGKey(3), (1, H, t, t)) if with_bias else None

  def ours(q, k, v, bias):
    kw = {} if bias is None else {'bias_fn': lambda qs, ks: bias}
    return A.dense_attention(q, k, v, mask=A.AttentionMask(q_pos=pos, k_pos=pos, k_valid=valid),
                             kernels=kernels, **kw)

  def plain(q, k, v, bias):
    rep = lambda x: jnp.repeat(x, H // G, axis=1)
    logits = jnp.einsum('bhqd,bhkd->bhqk', q, rep(k)) / math.sqrt(DH)
    if bias is not None:
      logits = logits + bias
    vis = (pos[:, None, :, None] >= pos[:, None, None, :]) & valid[:, None, None, :]
    p = jax.nn.softmax(jnp.where(vis, logits, -jnp.inf), axis=-1)
    return jnp.einsum('bhqk,bhkd->bhqd', jnp.where(vis, p, 0.0), rep(v))

  weights = jnp.cos(jnp.arange(B * H * t * DH, dtype=jnp.float32)).reshape(B, H, t, DH)
  args = (q, k, v, bias0)
  argnums = (0, 1, 2, 3) if with_bias else (0, 1, 2)
  loss = lambda f: jax.jit(jax.value_and_grad(lambda *a: jnp.sum(f(*a) * weights), argnums))
  got_loss, got = loss(ours)(*args)
  # the reference's fully masked row (batch 0, queries 0..2) is NaN: compare the rest
  ref_out = plain(*args)
  out = ours(*args)
  np.testing.assert_array_equal(out[0, :, :3], 0.0)
  np.testing.assert_allclose(out[0, :, 3:], ref_out[0, :, 3:], atol=1e-5)
  np.testing.assert_allclose(out[1], ref_out[1], atol=1e-5)
  masked = weights.at[0, :, :3].set(0.0)
  ref_loss, want = jax.value_and_grad(
      lambda *a: jnp.sum(jnp.nan_to_num(plain(*a)) * masked), argnums)(*args)
  np.testing.assert_allclose(got_loss, ref_loss, rtol=1e-5, atol=5e-5)  # a sum of ~700 terms
  for g_ours, g_ref in zip(got, want):
    chex.assert_equal_shape([g_ours, g_ref])
    np.testing.assert_allclose(g_ours, jnp.nan_to_num(g_ref), atol=1e-5)


def test_fully_masked_rows_are_zero_not_nan():
  t = 12
  q, k, v = _qkv(4, t, t)
  pos = _arange(t)
  valid = jnp.ones((B, t), bool).at[0, :4].set(False)  # row 0: queries 0..3 see no key
  for impl in ('dense', 'blockwise'):
    kw = {'block_size': 4} if impl == 'blockwise' else {}
    mask = A.AttentionMask(q_pos=pos, k_pos=pos, k_valid=valid)
    out = jax.jit(lambda q, k, v: A.attention_fn(impl)(q, k, v, mask=mask, **kw))(q, k, v)
    chex.assert_tree_all_finite(out)
    np.testing.assert_array_equal(out[0, :, :4], 0.0)
    assert float(jnp.max(jnp.abs(out[0, :, 4:]))) > 0


def test_gqa_equals_mha_with_repeated_kv():
  t = 10
  q, k, v = _qkv(5, t, t)
  pos = _arange(t)
  rep = lambda x: jnp.repeat(x, H // G, axis=1)
  for impl in ('dense', 'blockwise'):
    kw = {'block_size': 4} if impl == 'blockwise' else {}
    mask = A.AttentionMask.causal_from_positions(pos)
    fn = jax.jit(lambda q, k, v: A.attention_fn(impl)(q, k, v, mask=mask, **kw))
    np.testing.assert_allclose(fn(q, k, v), fn(q, rep(k), rep(v)), atol=1e-6)


def test_bfloat16_inputs_keep_dtype():
  t = 16
  q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(6, t, t))
  pos = _arange(t)
  for impl in ('dense', 'blockwise'):
    kw = {'block_size': 8} if impl == 'blockwise' else {}
    mask = A.AttentionMask.causal_from_positions(pos)
    out = jax.jit(lambda q, k, v: A.attention_fn(impl)(q, k, v, mask=mask, **kw))(q, k, v)
    chex.assert_type(out, jnp.bfloat16)
    ref = _reference(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                     pos, pos)
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=5e-2)


@pytest.mark.parametrize('plain', [True, False])
def test_fused_path_matches_dense(plain):
  """The cudnn path's wrapper (layout, GQA, masks), run with XLA's implementation on CPU."""
  t = 12
  q, k, v = _qkv(8, t, t)
  pos = _arange(t)
  kw = {}
  if not plain:
    valid = jnp.ones((B, t), bool).at[1, 3].set(False)
    doc = jnp.broadcast_to((jnp.arange(t) >= 5).astype(jnp.int32), (B, t))
    kw = dict(k_valid=valid, q_document=doc, k_document=doc)
  mask = A.AttentionMask(q_pos=pos, k_pos=pos, **kw)
  fused = jax.jit(lambda q, k, v: A.fused_attention(q, k, v, mask=mask, plain_causal=plain,
                                                    implementation='xla'))(q, k, v)
  dense = jax.jit(lambda q, k, v: A.dense_attention(q, k, v, mask=mask))(q, k, v)
  np.testing.assert_allclose(fused, dense, atol=1e-5)


def _temp_bytes(fn, t, **kw):
  spec = jax.ShapeDtypeStruct((1, 2, t, 16), jnp.float32)
  pos = jax.ShapeDtypeStruct((1, t), jnp.int32)
  f = lambda q, k, v, p: fn(q, k, v, mask=A.AttentionMask.causal_from_positions(p), **kw)
  return jax.jit(f).lower(spec, spec, spec, pos).compile().memory_analysis().temp_size_in_bytes


def test_blockwise_forward_memory_grows_linearly():
  """XLA's buffer assignment: dense scratch grows 4x per doubling of T, blockwise ~2x."""
  block = [_temp_bytes(A.blockwise_attention, t, block_size=128) for t in (1024, 2048, 4096)]
  dense_4096 = _temp_bytes(A.dense_attention, 4096)
  assert block[2] < 2.5 * block[1] < 2.5 * 2.5 * block[0]
  assert block[2] * 50 < dense_4096


def test_errors_are_clear():
  q, k, v = _qkv(7, 4, 4)
  mask = A.AttentionMask.causal_from_positions(_arange(4))
  with pytest.raises(ValueError, match='attention_impl'):
    A.attention_fn('flash')
  with pytest.raises(ValueError, match='cudnn'):
    A.cudnn_attention(q, k, v, mask=mask)  # the CPU backend
  with pytest.raises(ValueError, match='bias'):
    A.cudnn_attention(q, k, v, mask=mask, bias_fn=lambda a, b: 0.)
  with pytest.raises(ValueError, match='multiple of KV heads'):
    A.dense_attention(q, k[:, :1].repeat(3, axis=1), v[:, :1].repeat(3, axis=1), mask=mask)
  with pytest.raises(ValueError, match='block_size'):
    A.blockwise_attention(q, k, v, mask=mask, block_size=0)
