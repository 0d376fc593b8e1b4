"""The one-line recipes (bipe_jax/encodings/recipes.py): p-RoPE, interleaved NoPE layers and
log-length query scaling, against hand examples and model-level equalities."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax.encodings import recipes
from bipe_jax.encodings import rope

TOKENS = jnp.asarray(np.random.default_rng(0).integers(2, 16, (2, 12)), jnp.int32).at[:, 4].set(3)
assert (np.asarray(TOKENS) == 3).sum() >= 2  # separators: bipe_fox's gates act


@functools.lru_cache(maxsize=None)
def _logits(encoding, **extra):
  cfg = config_lib.ModelConfig(vocab_size=16, hidden_size=32, num_layers=2, num_heads=4,
                               ffn_size=32, position_encoding=encoding, separator_ids=(3,),
                               attention_impl='dense', **dict(extra))
  model = model_lib.Transformer(cfg)
  params = model.init(jax.random.PRNGKey(0), TOKENS)['params']
  return np.asarray(model.apply({'params': params}, TOKENS)), nn.meta.unbox(params)


def test_partial_rotary_keeps_the_highest_frequencies():
  inv = np.array([1.0, 0.1, 0.01, 0.001], np.float32)
  np.testing.assert_allclose(recipes.partial_rotary_frequencies(inv, 0.5), [1.0, 0.1, 0, 0],
                             rtol=1e-6)
  np.testing.assert_array_equal(recipes.partial_rotary_frequencies(inv, 1.0), inv)
  np.testing.assert_array_equal(recipes.partial_rotary_frequencies(inv, 0.0), [0, 0, 0, 0])
  with pytest.raises(ValueError, match='rope_fraction'):
    recipes.partial_rotary_frequencies(inv, 1.5)


def test_partial_rotary_leaves_the_dropped_pairs_unrotated():
  dh, half = 8, 4
  inv = recipes.partial_rotary_frequencies(rope.rope_inv_frequencies(dh), 0.5)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 1, 6, dh))
  pos = jnp.arange(6)[None]
  angles = pos[..., None].astype(jnp.float32) * inv
  cos = jnp.concatenate([jnp.cos(angles)] * 2, -1)[:, None]
  sin = jnp.concatenate([jnp.sin(angles)] * 2, -1)[:, None]
  y = rope.rotate(x, cos, sin)
  dropped = np.r_[2:half, half + 2:dh]  # pairs 2, 3 (the lowest frequencies)
  np.testing.assert_array_equal(np.asarray(y)[..., dropped], np.asarray(x)[..., dropped])
  assert not np.allclose(np.asarray(y)[..., 1:, :2], np.asarray(x)[..., 1:, :2])


def test_rope_fraction_zero_is_nope_and_one_is_rope():
  nope, _ = _logits('nope')
  full, _ = _logits('rope')
  np.testing.assert_allclose(_logits('rope', rope_fraction=0.0)[0], nope, atol=1e-6)
  np.testing.assert_array_equal(_logits('rope', rope_fraction=1.0)[0], full)
  half = _logits('rope', rope_fraction=0.5)[0]
  # (small at init: weights N(0, 0.02)); float32 rounding is ~1e-7 here
  assert np.abs(half - nope).max() > 1e-5 and np.abs(half - full).max() > 1e-5


def test_nope_every_layer_is_nope_and_every_second_drops_the_scheme_there():
  np.testing.assert_allclose(_logits('rope', nope_every=1)[0], _logits('nope')[0], atol=1e-6)
  logits, params = _logits('bipe_fox', nope_every=2)
  assert 'forget_gate' in params['layer_0']['attention']
  assert 'forget_gate' not in params['layer_1']['attention']
  assert 'intra_embed' in params  # the input embedding stays
  assert np.abs(logits - _logits('bipe_fox')[0]).max() > 1e-4
  with pytest.raises(ValueError, match='nope_every'):
    config_lib.ModelConfig(nope_every=2, scan_layers=True)


def test_query_log_scale_changes_only_positions_past_the_training_length():
  train = 8  # scale max(1, log(pos + 1) / log 8): 1 up to position 7, then > 1
  plain, _ = _logits('alibi', train_length=train)
  scaled, _ = _logits('alibi', train_length=train, query_log_scale=True)
  np.testing.assert_allclose(scaled[:, :train], plain[:, :train], atol=1e-6)
  assert np.abs(scaled[:, train:] - plain[:, train:]).min() > 0
  scale = np.asarray(rope.rope_log_scale(jnp.arange(12)[None], train, min_scale=1.0))[0]
  want = [max(1.0, np.log(p + 1) / np.log(train)) for p in range(12)]
  np.testing.assert_allclose(scale, want, rtol=1e-6)
  with pytest.raises(ValueError, match='query_log_scale'):
    config_lib.ModelConfig(query_log_scale=True, train_length=0)
