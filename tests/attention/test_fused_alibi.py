"""ALiBi / BiPE-ALiBi through jax.nn.dot_product_attention ('fused', XLA on CPU) as a per-key
bias: equal to the blockwise path in outputs and gradients; the identity checked by hand."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import attention
from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax.encodings import alibi


def _softmax_rows(x):
  x = x - x.max(-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def test_key_bias_equals_the_distance_bias_after_the_softmax_by_hand():
  # Segment ids of one row (never decreasing), 2 heads, random scores.
  inter = np.array([[0, 0, 1, 1, 1, 2, 4, 4]])
  slopes = alibi.alibi_slopes(2)
  scores = np.random.default_rng(0).standard_normal((1, 2, 8, 8))
  causal = np.tril(np.ones((8, 8), bool))
  dist = np.zeros((1, 2, 8, 8))
  for h in range(2):
    for i in range(8):
      for j in range(i + 1):
        dist[0, h, i, j] = -96 * slopes[h] * (inter[0, i] - inter[0, j])
  key = np.asarray(alibi.alibi_key_bias(jnp.asarray(inter), slopes, 96.0))
  chex.assert_shape(key, (1, 2, 1, 8))
  np.testing.assert_allclose(key[0, 1, 0], 96 * slopes[1] * inter[0], rtol=1e-6)
  want = _softmax_rows(np.where(causal, scores + dist, -1e30))
  got = _softmax_rows(np.where(causal, scores + key, -1e30))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(
      np.asarray(alibi.alibi_bias(jnp.asarray(inter), jnp.asarray(inter), slopes, 96.0)),
      np.where(causal, dist, 0.0), rtol=1e-6, atol=1e-6)


def _model(name, impl, **extra):
  fields = dict(vocab_size=16, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                ffn_size=64, position_encoding=name, separators='ids', separator_ids=(3, 4),
                max_intra=64, max_position=64, block_size=8, attention_impl=impl, bos_id=1)
  fields.update(extra)
  return model_lib.Transformer(config_lib.model_config_from_dict(fields))


TOKENS = jnp.asarray(np.random.default_rng(1).integers(0, 16, (2, 40)), jnp.int32)


@pytest.mark.parametrize('name,extra', [
    ('alibi', {}),
    ('bipe_alibi', {}),
    ('rope', {}),
    ('bipe_alibi', {'pad_id': 0}),
    ('bipe_alibi', {'restart_at_documents': True, 'mask_across_documents': True}),
])
def test_fused_equals_blockwise_in_outputs_and_gradients(name, extra):
  blockwise, fused = _model(name, 'blockwise', **extra), _model(name, 'fused', **extra)
  params = blockwise.init(jax.random.PRNGKey(0), TOKENS)['params']
  # Outputs at padding positions are not defined (a padding query sees no position); compare
  # the real tokens.
  real = TOKENS != extra.get('pad_id', -1)
  assert extra.get('pad_id') is None or not bool(real.all())

  def loss(model, p):
    logits = model.apply({'params': p}, TOKENS)
    weight = real[:, :-1] * jnp.arange(39.0) / 39
    return jnp.mean(jax.nn.log_softmax(logits)[:, :-1].max(-1) * weight)

  for jit in (False, True):
    fwd = (jax.jit(lambda p, m=m: m.apply({'params': p}, TOKENS)) if jit
           else (lambda p, m=m: m.apply({'params': p}, TOKENS)) for m in (blockwise, fused))
    want, got = (np.asarray(f(params))[np.asarray(real)] for f in fwd)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  g_want = jax.grad(lambda p: loss(blockwise, p))(params)
  g_got = jax.grad(lambda p: loss(fused, p))(params)
  chex.assert_trees_all_close(g_got, g_want, rtol=1e-4, atol=1e-6)


def test_fused_attention_takes_no_other_bias_and_configs_say_why():
  with pytest.raises(ValueError, match="attention_impl='fused' supports no bias_fn"):
    attention.attention_fn('fused')(
        jnp.zeros((1, 1, 2, 4)), jnp.zeros((1, 1, 2, 4)), jnp.zeros((1, 1, 2, 4)),
        mask=attention.AttentionMask.causal_from_positions(jnp.zeros((1, 2), jnp.int32)),
        bias_fn=lambda q, k: 0.0)
  with pytest.raises(ValueError, match="attention_impl.*'kerple'"):
    _model('kerple', 'fused')
  with pytest.raises(ValueError, match='mask_across_documents=True'):
    _model('bipe_alibi', 'fused', restart_at_documents=True)
