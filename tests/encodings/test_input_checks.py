"""Bad inputs to the public functions are one clear error, not silent wrong values: token ids out
of range (eager calls, generate(), bilevel_positions) and tensors of the wrong layout (alibi,
kerple, rope); under jit, where ids are not checked, what happens is pinned down here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import encodings
from bipe_jax import generation
from bipe_jax import input_checks
from bipe_jax import positions as positions_lib
from bipe_jax.config import ModelConfig
from bipe_jax.encodings import alibi
from bipe_jax.encodings import kerple
from bipe_jax.encodings import rope
from bipe_jax.model import Transformer

V = 16
TINY = ModelConfig(vocab_size=V, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2,
                   ffn_size=16, position_encoding='bipe_rope', max_position=16, max_intra=8,
                   separators='ids', separator_ids=(3,), attention_impl='dense')


@pytest.fixture(scope='module')
def model_and_params():
  model = Transformer(TINY)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))['params']
  return model, params


def test_check_token_ids_names_the_bad_ids_and_skips_padding_and_tracers():
  with pytest.raises(ValueError, match=r'prompt: ids \[-1, 16\] are out of range for vocab_size '
                                       r'16 \(allowed 0..15\)'):
    input_checks.check_token_ids(np.array([[1, 16, -1]]), V, 'prompt')
  input_checks.check_token_ids(np.array([[99, 1]]), V, valid=np.array([[False, True]]))
  jax.jit(lambda t: input_checks.check_token_ids(t, V) or t)(jnp.array([[99]]))  # not checked


def test_transformer_refuses_out_of_range_ids_eagerly_and_gives_nan_under_jit(model_and_params):
  model, params = model_and_params
  bad = jnp.array([[1, 2, V, 4]])
  with pytest.raises(ValueError, match=r'Transformer tokens: ids \[16\]'):
    model.apply({'params': params}, bad)
  # documented: not checked under jit; the NaN embedding of the bad id reaches every query of
  # its row through attention (a zero weight times NaN is NaN), other rows are untouched
  logits = jax.jit(model.apply)({'params': params}, jnp.concatenate([bad, bad.at[0, 2].set(5)]))
  assert np.isnan(logits[0]).all() and np.isfinite(logits[1]).all()


def test_generate_refuses_out_of_range_prompt_ids_before_compiling(model_and_params):
  model, params = model_and_params
  with pytest.raises(ValueError, match=r'prompt: ids \[20\] are out of range for vocab_size 16'):
    generation.generate(model, params, np.array([[1, 20]]), max_new_tokens=2)
  # the left padding may hold any id (its mask makes it padding); a real token may not
  tokens, valid = generation.left_pad([[1, 2], [-5]], pad_value=99)
  with pytest.raises(ValueError, match=r'prompt: ids \[-5\]'):
    generation.generate(model, params, tokens, prompt_valid_BxP=valid, max_new_tokens=1)


def test_a_token_beyond_the_separator_table_is_refused():
  table = positions_lib.separator_table(8, (3,))
  with pytest.raises(ValueError, match='beyond separator_table_V'):
    positions_lib.bilevel_positions(jnp.array([[1, 3, 9, 2]]), table)
  # under jit it is not checked: such an id is no separator (documented in input_checks)
  pos = jax.jit(lambda t: positions_lib.bilevel_positions(t, table))(jnp.array([[1, 9, 2]]))
  np.testing.assert_array_equal(pos.inter, [[0, 0, 0]])


def test_bias_functions_name_the_expected_layout():
  q = k = jnp.arange(4)[None]
  slopes = alibi.alibi_slopes(2)
  with pytest.raises(ValueError, match=r'alibi_bias: q_pos_BxQ must be \[B, Q\]'):
    alibi.alibi_bias(jnp.arange(4), k, slopes)
  with pytest.raises(ValueError, match='batch sizes'):
    alibi.alibi_bias(jnp.zeros((2, 4), jnp.int32), jnp.zeros((3, 4), jnp.int32), slopes)
  with pytest.raises(ValueError, match=r'slopes_H must be \[H\]'):
    alibi.alibi_bias(q, k, slopes[None])
  with pytest.raises(ValueError, match='same number of heads'):
    kerple.kerple_log_bias(q, k, jnp.ones(2), jnp.ones(3))
  with pytest.raises(ValueError, match=r'k_pos_BxK must be \[B, K\]'):
    kerple.kerple_log_bias(q, jnp.zeros((1, 1, 4), jnp.int32), jnp.ones(2), jnp.ones(2))
  assert alibi.alibi_bias(q, k, slopes).shape == (1, 2, 4, 4)  # B = 1 broadcasts
  assert alibi.alibi_bias(jnp.zeros((3, 4), jnp.int32), k, slopes).shape == (3, 2, 4, 4)


def test_apply_rope_refuses_the_token_major_layout_when_it_can_tell():
  inv = rope.rope_inv_frequencies(8)
  x_bthd = jnp.ones((2, 5, 3, 8))  # [B, T, H, Dh] with H != T
  with pytest.raises(ValueError, match=r'x looks like \[B, T, H, Dh\]: transpose'):
    rope.apply_rope(x_bthd, jnp.arange(5)[None], inv)
  with pytest.raises(ValueError, match=r'must be \[B, H, T, Dh\]'):
    rope.apply_rope(jnp.ones((5, 3, 8)), jnp.arange(5)[None], inv)
  with pytest.raises(ValueError, match='positions batch 3'):
    rope.apply_rope(jnp.ones((2, 3, 5, 8)), jnp.zeros((3, 5), jnp.int32), inv)
  # H == T: [B, T, H, Dh] and [B, H, T, Dh] have the same shape; no check can tell them apart
  assert rope.apply_rope(jnp.ones((2, 4, 4, 8)), jnp.arange(4)[None], inv).shape == (2, 4, 4, 8)


def test_kerple_clamp_is_exported():
  assert encodings.KERPLE_MIN == kerple.KERPLE_MIN == 0.01
  x = jnp.array([-1.0, 0.5])
  np.testing.assert_allclose(encodings.clamp_straight_through(x, encodings.KERPLE_MIN),
                             [0.01, 0.5], rtol=1e-6)
  np.testing.assert_allclose(
      jax.grad(lambda v: encodings.clamp_straight_through(v, 0.01).sum())(x), [1.0, 1.0])
