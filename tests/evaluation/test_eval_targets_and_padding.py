"""Every length of a sweep scores the same targets; padding never reaches DAPE V2's convolution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import config as model_config_lib
from bipe_jax import model as model_lib
from bipe_jax.data import pipeline
from bipe_jax.evaluation import sweep


def scored_positions(stream_len, length, lengths):
  tokens, mask = pipeline.cut_blocks(np.arange(stream_len), length)
  mask = sweep.common_targets(mask, lengths)
  return set(tokens[mask].tolist())


def test_common_targets_are_identical_across_lengths():
  lengths = [8, 16, 32, 64]
  sets = [scored_positions(640, n, lengths) for n in lengths]
  assert all(s == sets[0] for s in sets)
  assert sets[0] == {p for p in range(640) if p % 8}  # every position but the 1x block starts
  # Lengths that are not multiples of each other: positions at any block start are dropped.
  odd = [scored_positions(120, n, [6, 10]) for n in (6, 10)]
  assert odd[0] == odd[1] == {p for p in range(120) if p % 6 and p % 10}


def dapev2_model(impl):
  cfg = model_config_lib.model_config_from_dict(dict(
      position_encoding='dapev2_kerple', vocab_size=40, hidden_size=32, num_layers=2,
      num_heads=4, ffn_size=64, max_intra=32, max_position=32, block_size=4, pad_id=39,
      attention_impl=impl, dapev2_kernel=3))
  return model_lib.Transformer(cfg)


@pytest.mark.parametrize('impl', ['dense', 'blockwise'])
def test_left_padding_is_invisible_to_dapev2(impl):
  model = dapev2_model(impl)
  row = jnp.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]], jnp.int32)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), row)
  apply = jax.jit(model.apply)  # eager, every operation of the model is dispatched on its own
  plain = apply(params, row)
  for pad in (1, 3, 6):
    padded = jnp.concatenate([jnp.full((1, pad), 39, jnp.int32), row], axis=1)
    got = apply(params, padded)[:, pad:]
    np.testing.assert_allclose(got, plain, rtol=2e-5, atol=2e-5)
