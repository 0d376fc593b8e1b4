"""The Pallas kernels (interpret mode on CPU) equal dense attention with the project's bias
functions, in values and in gradients (q, k, v and the bias parameters), for every covered bias
kind with causal + document masking, GQA and ragged lengths; the TPU (Mosaic) lowering exports;
attention_impl='pallas' in the model equals 'dense' (the
same parameters, Kerple's clamp and T5's table included)."""

import functools

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bipe_jax import attention
from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax.attention import pallas
from bipe_jax.encodings import alibi
from bipe_jax.encodings import kerple
from bipe_jax.encodings import t5
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import train_state

B, H, G, T, D = 2, 4, 2, 21, 8  # T: not a multiple of the 8-row tiles
BUCKETS, MAX_DISTANCE = 8, 16
_RNG = np.random.default_rng(0)
Q, K, V = (jnp.asarray(_RNG.normal(size=s), jnp.float32)
           for s in ((B, H, T, D), (B, G, T, D), (B, G, T, D)))
POS = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
INTER = jnp.asarray(np.cumsum(_RNG.random((B, T)) < 0.3, axis=1), jnp.int32)  # segment ids
DOC = jnp.asarray([[0] * 9 + [1] * 12, [0] * 15 + [1] * 6], jnp.int32)
VALID = jnp.asarray([[True] * 19 + [False] * 2, [True] * 21])  # right padding in row 0


def _bias_case(kind):
  """(TileBias, params [H, P], the project's bias_fn of those params)."""
  if kind == 'none':
    return pallas.TileBias('none'), None, lambda params: None
  if kind == 'alibi':  # BiPE-ALiBi's x96
    slopes = alibi.alibi_slopes(H)
    return (pallas.TileBias('alibi'), jnp.asarray(96.0 * slopes)[:, None],
            lambda params: functools.partial(alibi.alibi_bias, slopes_H=slopes, slope_factor=96.))
  if kind == 'kerple':
    params = jnp.asarray(_RNG.uniform(0.01, 2.0, (H, 2)), jnp.float32)
    return (pallas.TileBias('kerple'), params,
            lambda p: lambda qs, ks: kerple.kerple_log_bias(qs, ks, p[:, 0], p[:, 1]))
  table = jnp.asarray(_RNG.normal(size=(H, BUCKETS)), jnp.float32)
  return (pallas.TileBias('t5', t5_buckets=BUCKETS, t5_max_distance=MAX_DISTANCE), table,
          lambda p: lambda qs, ks: t5.t5_bias(qs, ks, p.T, BUCKETS, MAX_DISTANCE))


def _both(kind, stream, causal=True, documents=True):
  """Losses (pallas, dense) of (q, k, v, params), each returning (loss, output)."""
  tile_bias, params, make_bias_fn = _bias_case(kind)
  docs = dict(q_document=DOC, k_document=DOC) if documents else {}
  mask = attention.AttentionMask(q_pos=POS, k_pos=POS, k_valid=VALID, causal=causal, **docs)

  def weigh(o):  # a loss that reaches every output element differently
    return jnp.sum(o * jnp.cos(o) * jnp.arange(1, D + 1)), o

  def pallas_loss(q, k, v, p):
    return weigh(pallas.pallas_attention(
        q, k, v, mask=mask, q_streams=stream, k_streams=stream, tile_bias=tile_bias,
        bias_params_HxP=p, block_q=8, block_k=8))

  def dense_loss(q, k, v, p):
    return weigh(attention.dense_attention(
        q, k, v, mask=mask, q_streams=stream, k_streams=stream, bias_fn=make_bias_fn(p)))

  return pallas_loss, dense_loss, params


def _check(kind, stream, **kw):
  pallas_loss, dense_loss, params = _both(kind, stream, **kw)
  argnums = (0, 1, 2) if params is None else (0, 1, 2, 3)
  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=argnums, has_aux=True))(Q, K, V, params)
  (_, got), g_got = grad(pallas_loss)
  (_, want), g_want = grad(dense_loss)
  real = np.asarray(VALID)[:, None, :, None]  # a padding query's row is not defined
  chex.assert_shape(got, (B, H, T, D))
  np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=2e-6)
  chex.assert_trees_all_close(g_got, g_want, atol=2e-5, rtol=1e-5)
  return g_got


@pytest.mark.parametrize('kind,stream', [('alibi', INTER), ('kerple', INTER), ('t5', POS),
                                         ('none', POS)],
                         ids=['bipe_alibi', 'bipe_kerple', 't5', 'none'])
def test_values_and_gradients_equal_dense_attention(kind, stream):
  grads = _check(kind, stream)
  if kind in ('kerple', 't5'):  # the learned parameters get a real gradient
    assert float(jnp.abs(grads[3]).min()) > 0.0


def test_without_causality_or_documents_and_under_jit():
  pallas_loss, dense_loss, params = _both('kerple', POS, causal=False, documents=False)
  got = jax.jit(jax.grad(lambda *a: pallas_loss(*a)[0], argnums=(0, 3)))(Q, K, V, params)
  want = jax.grad(lambda *a: dense_loss(*a)[0], argnums=(0, 3))(Q, K, V, params)  # no jit
  chex.assert_trees_all_close(got, want, atol=2e-5, rtol=1e-5)


def test_a_query_that_sees_no_key_gets_zeros_and_finite_gradients():
  valid = jnp.zeros((B, T), bool).at[:, 5:].set(True)  # rows 0..4 see nothing (causal)
  mask = attention.AttentionMask(q_pos=POS, k_pos=POS, k_valid=valid)
  f = lambda q: pallas.pallas_attention(q, K, V, mask=mask, block_q=8, block_k=8)
  out = jax.jit(f)(Q)
  np.testing.assert_array_equal(np.asarray(out[:, :, :5]), 0.0)
  assert np.isfinite(np.asarray(jax.jit(jax.grad(lambda q: jnp.sum(f(q))))(Q))).all()


def test_bad_parameters_are_one_clear_error():
  mask = attention.AttentionMask.causal_from_positions(POS)
  with pytest.raises(ValueError, match=r"bias 'kerple' needs params \[H, P\]=\(4, 2\)"):
    pallas.pallas_attention(Q, K, V, mask=mask, tile_bias=pallas.TileBias('kerple'),
                            bias_params_HxP=jnp.zeros((4, 1)))
  with pytest.raises(ValueError, match="bias kind 'fire' is not one of"):
    pallas.TileBias('fire')
  with pytest.raises(ValueError, match="attention_impl='pallas' takes the bias as tile_bias"):
    attention.attention_fn('pallas')(Q, K, V, mask=mask, bias_fn=lambda q, k: 0.0)


def test_the_tpu_lowering_is_mosaic_and_the_cpu_lowering_interprets():
  tile_bias, params, _ = _bias_case('t5')
  shapes = [jax.ShapeDtypeStruct(x.shape, jnp.bfloat16) for x in (Q, K, V)]

  def step(q, k, v):
    mask = attention.AttentionMask(q_pos=POS, k_pos=POS, q_document=DOC, k_document=DOC)
    out = pallas.pallas_attention(q, k, v, mask=mask, tile_bias=tile_bias, bias_params_HxP=params)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  grad = jax.jit(jax.grad(step, argnums=(0, 1, 2)))
  tpu = jax.export.export(grad, platforms=['tpu'])(*shapes).mlir_module()
  assert tpu.count('tpu_custom_call') == 3  # forward, dQ, dK / dV
  cpu = jax.export.export(grad, platforms=['cpu'])(*shapes).mlir_module()
  assert 'tpu_custom_call' not in cpu


def _model(name, impl, **extra):
  fields = dict(vocab_size=16, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                ffn_size=64, position_encoding=name, separators='ids', separator_ids=(3, 4),
                max_intra=64, max_position=64, block_size=8, attention_impl=impl, bos_id=1,
                t5_buckets=8, t5_max_distance=16, train_length=32)
  fields.update(extra)
  return model_lib.Transformer(config_lib.model_config_from_dict(fields))


TOKENS = jnp.asarray(np.random.default_rng(1).integers(0, 16, (2, 20)), jnp.int32)


@pytest.mark.parametrize('name,extra', [
    ('bipe_alibi', {'restart_at_documents': True, 'mask_across_documents': True}),
    ('kerple', {}),
    ('t5', {'pad_id': 0}),
    ('rope', {}),
    ('bipe_fox', {'pad_id': 0}),  # FoX's float positions, their gradient from the kernel
])
def test_model_with_pallas_equals_dense(name, extra):
  dense, kernel = _model(name, 'dense', **extra), _model(name, 'pallas', **extra)
  params = dense.init(jax.random.PRNGKey(0), TOKENS)['params']
  chex.assert_trees_all_equal_shapes(kernel.init(jax.random.PRNGKey(0), TOKENS)['params'],
                                     params)
  real = TOKENS != extra.get('pad_id', -1)

  def loss(model, p):
    logits = model.apply({'params': p}, TOKENS)
    return jnp.mean(jax.nn.log_softmax(logits).max(-1) * real * jnp.arange(20.0))

  want, g_want = jax.jit(jax.value_and_grad(lambda p: loss(dense, p)))(params)
  # Under the training mesh (one device here) the kernels run inside a shard_map.
  mesh = mesh_lib.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1)))
  with train_state.mesh_context(mesh):
    got, g_got = jax.jit(jax.value_and_grad(lambda p: loss(kernel, p)))(params)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  chex.assert_trees_all_close(g_got, g_want, rtol=1e-4, atol=1e-6)


def test_config_refuses_the_encodings_the_kernel_does_not_cover():
  for name in ('fire', 'dape_kerple'):
    with pytest.raises(ValueError, match="attention_impl.*compute only the ALiBi, Kerple, T5"):
      _model(name, 'pallas')
