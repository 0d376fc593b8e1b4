"""FIRE and T5 as the official DAPE code computes them, checked against loop references:
FIRE's activation (LeakyReLU under DAPE, ReLU alone), FIRE's L0 (init_L // 2), T5's bias
(weight[bucket] * sqrt(head_dim), xavier_normal init) and the exact T5 parameter conversion.

The model-level tests record what the model's own bias modules compute during a forward pass
(flax method interception), so they check the model's wiring, not a helper.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import config as config_lib
from bipe_jax import encodings as E
from bipe_jax.config import ModelConfig
from bipe_jax.encodings import t5
from bipe_jax.model import Transformer
from tests import reference_numpy as ref

# head_size 8, train_length 64: FIRE's L0 is 64 // 4 // 2 = 8 by default (the old 64 differs).
TINY = ModelConfig(vocab_size=32, hidden_size=32, num_layers=1, num_heads=4, ffn_size=32,
                   max_intra=16, max_position=32, train_length=64, separator_ids=(3,),
                   block_size=8, attention_impl='dense', fire_hidden=6, dape_hidden=4,
                   t5_buckets=8, t5_max_distance=16)
T = 20


def _cfg(name, **kw):
  return config_lib.validate_model_config(dataclasses.replace(TINY, position_encoding=name, **kw))


def _recorded_calls(cfg, module_type, seed=0):
  """[(module, args, output)] of every `module_type` call in one forward pass of `cfg`'s model,
  with params drawn wide (std 0.5) so FIRE's hidden units see negative pre-activations."""
  model = Transformer(cfg)
  tokens = jnp.asarray(np.random.default_rng(seed).integers(4, 32, size=(1, T)), jnp.int32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(seed), tokens))['params']
  leaves, treedef = jax.tree.flatten(shapes)  # no init compile: the values are drawn below
  rng = np.random.default_rng(seed + 1)
  params = jax.tree.unflatten(treedef, [
      jnp.asarray(rng.normal(size=x.shape) * 0.5 + (1.0 if x.ndim == 0 else 0.0), x.dtype)
      for x in leaves])  # scalars (FIRE's c, L_multiplier) stay positive, near 1
  calls = []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, module_type) and context.method_name == '__call__':
      calls.append((context.module, args, np.asarray(out)))
    return out

  with nn.intercept_methods(record):
    model.apply({'params': params}, tokens)
  assert calls, f'no {module_type.__name__} call recorded'
  return calls


def _fire_reference(module, args, l0, slope):
  prm = jax.tree.map(np.asarray, module.variables['params'])
  return ref.fire_bias_ref(np.asarray(args[0]), np.asarray(args[1]), c=prm['c'],
                           l_multiplier=prm['L_multiplier'], init_L=l0, w_in=prm['w_in'],
                           b_in=prm['b_in'], w_out=prm['w_out'], b_out=prm['b_out'],
                           negative_slope=slope)


@pytest.mark.parametrize('name,slope', [('dape_fire', 0.01), ('fire', 0.0)])
def test_model_fire_activation_and_l0_match_the_official_classes(name, slope):
  """FIRE under DAPE: LeakyReLU(0.01) (official FIRE_C / FIRE_DAPEV2); plain FIRE: ReLU. L0 is
  init_L // 2 with init_L = train_length // 4 (released 512-token configs: 128 -> 64)."""
  for module, args, out in _recorded_calls(_cfg(name), E.FireBias):
    expected = _fire_reference(module, args, 8.0, slope)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    other = _fire_reference(module, args, 8.0, 0.01 - slope)  # the other activation differs
    assert np.abs(out - other).max() > 1e-3


@pytest.mark.parametrize('kw,l0', [
    ({}, 8),                                                   # 64 // 4 // 2
    ({'fire_init_L': 128}, 64),                                # the released 512-token configs
    ({'fire_init_L': 128, 'fire_halve_init_L': False}, 128),  # standalone DAPE.py
    ({'fire_halve_init_L': False}, 16),
])
def test_fire_l0_options(kw, l0):
  cfg = _cfg('dape_fire', **kw)
  assert cfg.fire_L0 == l0
  (module, args, out), *_ = _recorded_calls(cfg, E.FireBias)
  assert module.init_L == l0
  np.testing.assert_allclose(out, _fire_reference(module, args, float(l0), 0.01), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize('bad', [{'fire_init_L': -1}, {'fire_halve_init_L': 1}])
def test_bad_fire_l0_fields_are_named(bad):
  with pytest.raises(ValueError, match=next(iter(bad))):
    _cfg('fire', **bad)


def test_model_t5_bias_is_weight_times_sqrt_head_dim():
  """Official: bias = weight[bucket] * sqrt(head_dim), added to q.k / sqrt(head_dim)."""
  for module, args, out in _recorded_calls(_cfg('t5'), E.T5RelativeBias):
    weight = np.asarray(module.variables['params']['rel_embedding'], np.float64)
    expected = ref._pairwise_ref(  # pylint: disable=protected-access
        np.asarray(args[0]), np.asarray(args[1]), 4,
        lambda h, i, j: weight[ref.t5_bucket_ref(i - j, 8, 16), h] * math.sqrt(8))
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_t5_weight_init_is_torch_xavier_normal():
  """xavier_normal_ on a [buckets, heads] weight: std sqrt(2 / (fan_in + fan_out)) (the sum is
  the same whichever dimension is fan_in), an untruncated normal."""
  module = E.T5RelativeBias(num_heads=64, num_buckets=64, max_distance=128)
  pos = jnp.zeros((1, 1), jnp.int32)
  weight = np.asarray(module.init(jax.random.key(0), pos, pos)['params']['rel_embedding'])
  std = math.sqrt(2.0 / (64 + 64))  # 0.125
  assert weight.shape == (64, 64)
  assert abs(weight.std() / std - 1) < 0.05 and abs(weight.mean()) < 0.01
  beyond_two_std = np.mean(np.abs(weight) > 2 * std)  # 4.55 % for a normal, 0 if truncated
  assert 0.03 < beyond_two_std < 0.065


def test_t5_conversion_between_table_and_scaled_weight_is_exact():
  """bias(table_from_weight(w), scale 1) == bias(w, scale) bit for bit, and the round trip
  table -> weight -> table is exact for a power-of-two scale (head_dim 16, 64)."""
  rng = np.random.default_rng(0)
  pos = jnp.arange(40)[None]
  for head_dim in (8, 16, 64):
    scale = t5.t5_scale(head_dim)
    weight = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
    scaled = t5.t5_bias(pos, pos, weight, 8, 16, scale=scale)
    plain = t5.t5_bias(pos, pos, t5.t5_table_from_weight(weight, scale), 8, 16)
    np.testing.assert_array_equal(np.asarray(scaled), np.asarray(plain))
    table = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
    back = t5.t5_table_from_weight(t5.t5_weight_from_table(table, scale), scale)
    if head_dim in (16, 64):
      np.testing.assert_array_equal(np.asarray(back), np.asarray(table))
    else:
      np.testing.assert_allclose(np.asarray(back), np.asarray(table), rtol=2e-7)
