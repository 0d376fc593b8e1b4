"""FoX, the bilevel forget gate and CoPE (encodings/fox.py, cope.py) against loop-based NumPy
references (tests/reference_numpy.py): values and gradients on the dense and blockwise paths,
the invariances, and the model-level equalities (bipe_fox with fixed gates == bipe_alibi)."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import attention
from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax import positions
from bipe_jax.encodings import alibi
from bipe_jax.encodings import cope
from bipe_jax.encodings import fox
from tests import reference_numpy as ref

B, H, T, DH = 1, 2, 11, 4  # T not a multiple of the block: the tails are padded
BLOCK = 4
SEP = 3
TOKENS = np.array([[5, SEP, 6, 7, SEP, SEP, 8, 9, 5, SEP, 6]], np.int32)
VALID = np.array([[True, True, False, True, True, True, True, False, True, True, True]])
NPOS = 5  # CoPE positions 0..4: p clamps for the far keys


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (rng.normal(0, 1.0, (B, H, T, DH)).astype(np.float32) for _ in range(3))
  log_f = np.log(rng.uniform(0.3, 0.95, (B, T, H))).astype(np.float32)
  emb = rng.normal(0, 1.0, (NPOS, DH)).astype(np.float32)
  weight = rng.normal(0, 1.0, (B, H, T, DH)).astype(np.float32)  # loss = sum(out * weight)
  return q, k, v, log_f, emb, weight


def _bilevel_mask():
  """log f kept only at segment starts (the token after a separator), padding dropped."""
  return ref.segment_starts_ref(TOKENS, (SEP,), VALID)


def _fox_jax(impl, q, k, v, log_f, valid, starts=None, shift=0.0):
  """Output of attention with the FoX bias (c = prefix sum of the masked log gates)."""
  c = fox.cumulative_log_gates(fox.masked_log_gates(log_f, valid, starts)) + shift
  pos = jnp.broadcast_to(jnp.arange(T), (B, T))
  fn = attention.dense_attention if impl == 'dense' else functools.partial(
      attention.blockwise_attention, block_size=BLOCK)
  return fn(q, k, v, mask=attention.AttentionMask(q_pos=pos, k_pos=pos, k_valid=valid),
            q_streams=c, k_streams=c, bias_fn=fox.fox_bias)


def _fox_ref_loss(bilevel, q, k, v, log_f, weight):
  keep = VALID & (_bilevel_mask() if bilevel else True)
  masked = np.where(keep[:, :, None], log_f, 0.0)
  return float(np.sum(ref.fox_attention_ref(q, k, v, masked, VALID) * weight))


@functools.lru_cache(maxsize=None)
def _fox_reference(bilevel):
  q, k, v, log_f, _, weight = _inputs()
  keep = VALID & (_bilevel_mask() if bilevel else True)
  out = ref.fox_attention_ref(q, k, v, np.where(keep[:, :, None], log_f, 0.0), VALID)
  grads = ref.numerical_grads(lambda *a: _fox_ref_loss(bilevel, *a, weight), [q, k, v, log_f])
  return out, grads


def test_segment_starts_match_the_loop_reference():
  pos = positions.bilevel_positions(jnp.asarray(TOKENS), positions.separator_table(16, (SEP,)),
                                    valid_BxT=jnp.asarray(VALID))
  got = fox.segment_starts(pos.intra, pos.inter, pos.valid)
  np.testing.assert_array_equal(np.asarray(got), _bilevel_mask())
  assert _bilevel_mask().sum() == 4  # the double separator opens two segments


@pytest.mark.parametrize('impl,bilevel,jit', [
    ('dense', False, True), ('dense', True, True), ('blockwise', False, True),
    ('blockwise', True, True), ('dense', False, False), ('blockwise', True, False)])
def test_fox_values_and_gradients_match_reference(impl, bilevel, jit):
  q, k, v, log_f, _, weight = _inputs()
  starts = jnp.asarray(_bilevel_mask()) if bilevel else None
  valid = jnp.asarray(VALID)

  def loss(q, k, v, log_f):
    out = _fox_jax(impl, q, k, v, log_f, valid, starts)
    return jnp.sum(out * weight), out

  grad_fn = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
  grad_fn = jax.jit(grad_fn) if jit else grad_fn
  (_, out), grads = grad_fn(*map(jnp.asarray, (q, k, v, log_f)))
  chex.assert_shape(out, (B, H, T, DH))
  want_out, want_grads = _fox_reference(bilevel)
  np.testing.assert_allclose(np.asarray(out), want_out, atol=1e-5, rtol=1e-5)
  for got, want in zip(grads, want_grads):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-4)
  if bilevel:  # no gradient reaches a gate that is not at a segment start
    assert np.all(np.asarray(grads[3])[~_bilevel_mask()] == 0)


@pytest.mark.parametrize('impl', ['dense', 'blockwise'])
def test_fox_is_unchanged_when_c_is_shifted(impl):
  q, k, v, log_f, _, _ = _inputs(1)
  args = (impl, *map(jnp.asarray, (q, k, v, log_f)), jnp.asarray(VALID))
  base = _fox_jax(*args)
  # (float32: a shift of s moves c by ~s * 6e-8 of rounding, so keep s moderate)
  for shift in (37.5, -64.0, jnp.array([[[3.0, -8.0]]])):  # a per-head shift too
    np.testing.assert_allclose(np.asarray(_fox_jax(*args, shift=shift)), np.asarray(base),
                               atol=2e-5)
  # and the bias is not trivial: dropping the gates changes the output
  no_gates = _fox_jax(impl, *map(jnp.asarray, (q, k, v, 0 * log_f)), jnp.asarray(VALID))
  assert float(jnp.max(jnp.abs(no_gates - base))) > 1e-2


def _cope_jax(q, k, v, emb):
  pos = jnp.broadcast_to(jnp.arange(T), (B, T))
  qe = jnp.einsum('bhqd,nd->bhqn', q, emb)
  return attention.dense_attention(q, k, v, mask=attention.AttentionMask.causal_from_positions(pos),
                                   transform_fn=cope.cope_transform(qe, 1 / np.sqrt(DH)))


@pytest.mark.parametrize('jit', [False, True], ids=['eager', 'jit'])
def test_cope_values_and_gradients_match_reference(jit):
  q, k, v, _, emb, weight = _inputs(2)
  emb = emb * 3  # positions matter clearly

  def loss(q, k, v, emb):
    out = _cope_jax(q, k, v, emb)
    return jnp.sum(out * weight), out

  grad_fn = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
  grad_fn = jax.jit(grad_fn) if jit else grad_fn
  (_, out), grads = grad_fn(*map(jnp.asarray, (q, k, v, emb)))
  want = ref.cope_attention_ref(q, k, v, emb)
  np.testing.assert_allclose(np.asarray(out), want, atol=1e-5, rtol=1e-5)
  ref_loss = lambda *a: float(np.sum(ref.cope_attention_ref(*a) * weight))
  for got, want_g in zip(grads, ref.numerical_grads(ref_loss, [q, k, v, emb])):
    np.testing.assert_allclose(np.asarray(got), want_g, atol=1e-5, rtol=1e-4)


def test_cope_positions_hand_example():
  # scores 0 -> every gate 1/2: p_ij = (i - j + 1) / 2, clamped at npos - 1 = 2
  scores = jnp.zeros((1, 1, 4, 4))
  visible = jnp.tril(jnp.ones((4, 4), bool))[None, None]
  p = cope.cope_positions(scores, visible, npos=3)
  want = [[0.5, 0, 0, 0], [1.0, 0.5, 0, 0], [1.5, 1.0, 0.5, 0], [2.0, 1.5, 1.0, 0.5]]
  np.testing.assert_allclose(np.asarray(p[0, 0]), want)


def test_cope_refuses_long_rows_in_one_line():
  with pytest.raises(ValueError, match='COPE_DENSE_MAX_TOKENS') as err:
    cope.check_length(cope.COPE_DENSE_MAX_TOKENS + 1)
  assert '\n' not in str(err.value)


# ------------------------------------------------------------------------------ model level

def _model(encoding, impl='dense', **extra):
  cfg = config_lib.ModelConfig(vocab_size=16, hidden_size=32, num_layers=2, num_heads=4,
                               ffn_size=32, position_encoding=encoding, separator_ids=(SEP,),
                               max_intra=32, attention_impl=impl, block_size=8, **extra)
  return model_lib.Transformer(cfg)


@pytest.mark.parametrize('impl', ['dense', 'blockwise'])
def test_bipe_fox_with_fixed_gates_equals_bipe_alibi(impl):
  """log f = -96 m_h at every segment start (kernel 0, bias b with log sigmoid(b) = -96 m_h):
  c_i - c_j = -96 m_h (inter_i - inter_j), bipe_alibi's bias."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(4, 16, (2, 20)), jnp.int32)
  tokens = tokens.at[0, jnp.array([3, 4, 9, 15])].set(SEP).at[1, jnp.array([0, 7])].set(SEP)
  alibi_model, fox_model = _model('bipe_alibi', impl), _model('bipe_fox', impl)
  params = nn.meta.unbox(jax.jit(alibi_model.init)(jax.random.PRNGKey(0), tokens)['params'])
  slopes = 96.0 * alibi.alibi_slopes(4)
  fixed = {'bias': jnp.asarray(-np.log(np.expm1(slopes.astype(np.float64))), jnp.float32),
           'kernel': jnp.zeros((32, 4), jnp.float32)}
  np.testing.assert_allclose(np.asarray(jax.nn.log_sigmoid(fixed['bias'])), -slopes, rtol=1e-6)
  fox_params = jax.tree.map(lambda x: x, params)
  for i in range(2):
    fox_params[f'layer_{i}']['attention']['forget_gate'] = fixed
  apply_fox = jax.jit(fox_model.apply)
  want = jax.jit(alibi_model.apply)({'params': params}, tokens)
  got = apply_fox({'params': fox_params}, tokens)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
  # a learned gate differs from it
  fox_params['layer_0']['attention']['forget_gate'] = {'bias': jnp.zeros(4),
                                                       'kernel': jnp.zeros((32, 4))}
  other = apply_fox({'params': fox_params}, tokens)
  assert float(jnp.max(jnp.abs(other - want))) > 1e-3


@pytest.mark.parametrize('encoding', ['fox', 'bipe_fox', 'fox_bias_only', 'cope'])
def test_parameters_of_each_scheme(encoding):
  """(Blockwise == dense, causality and decode == full forward of every scheme are in
  tests/model/test_model.py::test_every_scheme and tests/model/test_generation.py.)"""
  model = _model(encoding, max_position=16)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32)))
  attn = nn.meta.unbox(shapes['params'])['layer_0']['attention']
  assert ('cope' in attn) == (encoding == 'cope')
  assert ('forget_gate' in attn) == (encoding != 'cope')
  if encoding == 'cope':
    assert attn['cope']['embedding'].shape == (17, 8)  # max_position + 1, Dh
  else:
    assert attn['forget_gate']['bias'].shape == (4,)
    assert ('kernel' in attn['forget_gate']) == (encoding != 'fox_bias_only')


@pytest.mark.parametrize('encoding', ['fox', 'bipe_fox', 'fox_bias_only', 'cope'])
def test_hf_export_refuses_in_one_line(encoding):
  from bipe_jax.interop import hf_llama  # pylint: disable=import-outside-toplevel
  fields = dict(config_lib.default_fields(), position_encoding=encoding, separator_ids=(SEP,))
  with pytest.raises(ValueError, match='no Hugging Face Llama equivalent') as err:
    hf_llama.hf_config_from_model_fields(fields)
  assert '\n' not in str(err.value)


@pytest.mark.parametrize('encoding,impl', [('fox', 'fused'), ('cope', 'pallas'),
                                           ('cope', 'fused')])
def test_unsupported_attention_paths_are_refused(encoding, impl):
  with pytest.raises(ValueError, match='attention_impl'):
    _model(encoding, impl)


def test_pruning_skips_blocks_below_the_tolerance_and_keeps_the_rest():
  """Strong decay (log f = -3): the block (queries 12..15, keys 0..3) has every bias <= -27,
  below -(2U + log K) - 12, so it is skipped; values 0..3 are NaN, so a block that was not
  skipped would make its rows NaN. Rows 12..15 then equal the loop reference (whose weights on
  keys 0..3 are below e^-27)."""
  t, dh = 16, 4
  rng = np.random.default_rng(5)
  q, k, v = (rng.normal(0, 0.5, (1, 1, t, dh)).astype(np.float32) for _ in range(3))
  log_f = np.full((1, t, 1), -3.0, np.float32)
  want = ref.fox_attention_ref(q, k, v, log_f)[0, 0, 12:]
  v_nan = v.copy()
  v_nan[:, :, :4] = np.nan
  c = fox.cumulative_log_gates(jnp.asarray(log_f))
  pos = jnp.arange(t)[None]

  def attend(tolerance):
    prune = None if tolerance is None else fox.block_prune(tolerance)
    return np.asarray(attention.blockwise_attention(
        jnp.asarray(q), jnp.asarray(k), jnp.asarray(v_nan),
        mask=attention.AttentionMask.causal_from_positions(pos), q_streams=c, k_streams=c,
        bias_fn=fox.fox_bias, block_size=4, block_prune=prune))[0, 0]

  assert np.isnan(attend(None)[12:]).all()  # without pruning the NaN values are read
  threshold = float(fox.pruning_threshold(jnp.asarray(q), jnp.asarray(k), t, -12.0))
  assert -27 < threshold < -15  # between the two blocks' bounds (c_12 - c_3, c_8 - c_3)
  pruned = attend(-12.0)
  np.testing.assert_allclose(pruned[12:], want, atol=1e-5)
  assert np.isnan(pruned[8:12]).all()  # bias -15 there: above the threshold, not skipped


@pytest.mark.parametrize('bilevel', [False, True], ids=['fox', 'bipe_fox'])
def test_pallas_interpret_values_and_gradients_match_reference(bilevel):
  """The Pallas tile-bias kernel (interpret mode on CPU, tiles of 8: two query and key tiles),
  c as float positions: output and gradients (q, k, v and the log gates, through the kernel's
  d c) equal the loop reference."""
  from bipe_jax.attention import pallas  # pylint: disable=import-outside-toplevel
  q, k, v, log_f, _, weight = _inputs()
  starts = jnp.asarray(_bilevel_mask()) if bilevel else None
  valid = jnp.asarray(VALID)
  pos = jnp.broadcast_to(jnp.arange(T), (B, T))

  def loss(q, k, v, log_f):
    c = fox.cumulative_log_gates(fox.masked_log_gates(log_f, valid, starts))
    out = pallas.pallas_attention(q, k, v,
                                  mask=attention.AttentionMask(q_pos=pos, k_pos=pos, k_valid=valid),
                                  q_streams=c, k_streams=c, tile_bias=pallas.TileBias('fox'),
                                  block_q=8, block_k=8, interpret=True)
    return jnp.sum(out * weight), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(
      *map(jnp.asarray, (q, k, v, log_f)))
  want_out, want_grads = _fox_reference(bilevel)
  np.testing.assert_allclose(np.asarray(out), want_out, atol=1e-5, rtol=1e-5)
  for got, want in zip(grads, want_grads):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-4)
