"""Scanned layers (`model.scan_layers`): the same logits, gradients and decoding as the
unrolled model, with parameters converted between the two layouts."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import config as config_lib
from bipe_jax import generation
from bipe_jax import model as model_lib
from bipe_jax.interop import hf_llama

TOKENS = jnp.asarray(np.random.default_rng(3).integers(0, 16, (2, 24)), jnp.int32)
LAYERS = 2  # a scan of two layers is what three would test, at two thirds of the unrolled compile


def _models(name, **extra):
  fields = dict(vocab_size=16, hidden_size=32, num_layers=LAYERS, num_heads=4, num_kv_heads=2,
                ffn_size=64, position_encoding=name, separators='ids', separator_ids=(3, 4),
                max_intra=32, max_position=32, train_length=24, block_size=8, bos_id=1)
  fields.update(extra)
  unrolled = model_lib.Transformer(config_lib.model_config_from_dict(fields))
  scanned = model_lib.Transformer(config_lib.model_config_from_dict({**fields,
                                                                     'scan_layers': True}))
  return unrolled, scanned


def _init(model, seed):
  return nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(seed), TOKENS)['params'])


def _loss(model, params):
  logits = model.apply({'params': params}, TOKENS)
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]),
                                       TOKENS[:, 1:, None], -1))


# The logits are compared without jit (op by op: most of a case's time) for the first case only.
@pytest.mark.parametrize('name,extra,eager', [('bipe_rope', {}, True),
                                              ('bipe_alibi', {'remat': True}, False),
                                              ('dape_kerple', {}, False), ('fire', {}, False)])
def test_scanned_equals_unrolled_in_logits_and_gradients(name, extra, eager):
  unrolled, scanned = _models(name, **extra)
  params = _init(unrolled, 0)
  stacked = model_lib.stack_layer_params(params, LAYERS)
  own = nn.meta.unbox(jax.eval_shape(scanned.init, jax.random.PRNGKey(0), TOKENS)['params'])
  chex.assert_trees_all_equal_shapes(stacked, own)  # the converter gives the scanned layout
  jitted = jax.jit(lambda m, p: m.apply({'params': p}, TOKENS), static_argnums=0)
  for apply in ((lambda m, p: m.apply({'params': p}, TOKENS)), jitted) if eager else (jitted,):
    np.testing.assert_allclose(apply(scanned, stacked), apply(unrolled, params),
                               rtol=1e-5, atol=1e-5)
  g_unrolled = jax.jit(jax.grad(functools.partial(_loss, unrolled)))(params)
  g_scanned = jax.jit(jax.grad(functools.partial(_loss, scanned)))(stacked)
  chex.assert_trees_all_close(model_lib.unstack_layer_params(g_scanned), g_unrolled,
                              rtol=1e-4, atol=1e-6)


def test_layouts_round_trip_and_match():
  unrolled, _ = _models('bipe_rope')
  params = _init(unrolled, 1)
  stacked = model_lib.stack_layer_params(params, LAYERS)
  chex.assert_shape(stacked['layers']['attention']['query']['kernel'], (LAYERS, 32, 4, 8))
  chex.assert_trees_all_equal(model_lib.unstack_layer_params(stacked), params)
  chex.assert_trees_all_equal(model_lib.match_layer_layout(params, stacked), stacked)
  chex.assert_trees_all_equal(model_lib.match_layer_layout(stacked, params), params)
  with pytest.raises(ValueError, match='missing'):
    model_lib.stack_layer_params(params, LAYERS + 1)
  # The Hugging Face export reads either layout.
  fields = dict(num_layers=LAYERS, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=0,
                ffn_size=64, vocab_size=16, position_encoding='bipe_rope', max_intra=32)
  a = hf_llama.hf_weights_from_params(params, fields)
  b = hf_llama.hf_weights_from_params(stacked, fields)
  chex.assert_trees_all_equal(a, b)


def test_scanned_decoding_equals_unrolled_decoding():
  unrolled, scanned = _models('bipe_rope')
  params = _init(unrolled, 2)
  prompt = TOKENS[:, :7]
  want = generation.generate(unrolled, params, prompt, max_new_tokens=6)
  got = generation.generate(scanned, model_lib.stack_layer_params(params, LAYERS), prompt,
                            max_new_tokens=6)
  np.testing.assert_array_equal(got, want)
