"""The GPU (Triton) tile-bias kernels, in interpret mode on CPU, equal dense attention with the
project's bias functions in values and gradients (q, k, v and the bias parameters), with causal,
document and padding masks, GQA and ragged lengths; they lower for CUDA as Triton calls, also
inside the 151M training step; attention_impl='auto' picks them on a GPU."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import attention
from bipe_jax.attention import support as attention_support
from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax.attention import pallas
from bipe_jax import schemes
from bipe_jax.encodings import alibi
from bipe_jax.encodings import kerple
from bipe_jax.encodings import t5
from bipe_jax.attention.pallas import gpu_attention
from bipe_jax.compile import aot as aot_compile
from configs import paper_151m

B, H, G, T, D = 2, 4, 2, 37, 16  # T: not a multiple of the 16-row tiles
BUCKETS, MAX_DISTANCE = 8, 16
_RNG = np.random.default_rng(1)
Q, K, V = (jnp.asarray(_RNG.normal(size=s), jnp.float32)
           for s in ((B, H, T, D), (B, G, T, D), (B, G, T, D)))
POS = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
INTER = jnp.asarray(np.cumsum(_RNG.random((B, T)) < 0.3, axis=1), jnp.int32)
DOC = jnp.asarray([[0] * 20 + [1] * 17, [0] * 30 + [1] * 7], jnp.int32)
VALID = jnp.asarray([[True] * 33 + [False] * 4, [True] * 37])
MASK = attention.AttentionMask.causal_from_positions(POS)


def _case(kind):
  """(TileBias, params [H, P] or None, params -> the project's bias_fn)."""
  if kind == 'none':
    return pallas.TileBias('none'), None, lambda p: None
  if kind == 'alibi':
    slopes = alibi.alibi_slopes(H)
    return (pallas.TileBias('alibi'), jnp.asarray(96.0 * slopes)[:, None],
            lambda p: functools.partial(alibi.alibi_bias, slopes_H=slopes, slope_factor=96.))
  if kind == 'kerple':
    return (pallas.TileBias('kerple'), jnp.asarray(_RNG.uniform(0.01, 2.0, (H, 2)), jnp.float32),
            lambda p: lambda qs, ks: kerple.kerple_log_bias(qs, ks, p[:, 0], p[:, 1]))
  return (pallas.TileBias('t5', t5_buckets=BUCKETS, t5_max_distance=MAX_DISTANCE),
          jnp.asarray(_RNG.normal(size=(H, BUCKETS)), jnp.float32),
          lambda p: lambda qs, ks: t5.t5_bias(qs, ks, p.T, BUCKETS, MAX_DISTANCE))


def _losses(kind, stream, causal, masks):
  tile_bias, params, bias_fn_of = _case(kind)
  mask = attention.AttentionMask(q_pos=POS, k_pos=POS, causal=causal, **masks)
  weigh = lambda o: jnp.sum(o * jnp.cos(o) * jnp.arange(1, D + 1))  # pylint: disable=unnecessary-lambda-assignment

  def gpu_loss(q, k, v, p):
    return weigh(gpu_attention.pallas_gpu_attention(
        q, k, v, mask=mask, q_streams=stream, k_streams=stream, tile_bias=tile_bias,
        bias_params_HxP=p, block_q=16, block_k=16))

  def dense_loss(q, k, v, p):
    return weigh(attention.dense_attention(
        q, k, v, mask=mask, q_streams=stream, k_streams=stream, bias_fn=bias_fn_of(p)))

  return gpu_loss, dense_loss, params


@pytest.mark.parametrize('kind', ['none', 'alibi', 'kerple', 't5'])
@pytest.mark.parametrize('causal', [True, False])
def test_values_and_gradients_equal_dense(kind, causal):
  masks = dict(k_valid=VALID, q_document=DOC, k_document=DOC)
  gpu_loss, dense_loss, params = _losses(kind, INTER if kind == 'alibi' else None, causal,
                                         masks)
  if params is None:  # 'none': a zero parameter the kernel ignores
    params = jnp.zeros((H, 1), jnp.float32)
  argnums = (0, 1, 2) if kind in ('none', 'alibi') else (0, 1, 2, 3)
  got = jax.jit(jax.value_and_grad(gpu_loss, argnums=argnums))(Q, K, V, params)
  want = jax.value_and_grad(dense_loss, argnums=argnums)(Q, K, V, params)
  chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)
  assert np.abs(np.asarray(got[1][0])).sum() > 0  # the gradient reaches q


def test_output_shape_and_no_jit():
  out = gpu_attention.pallas_gpu_attention(Q, K, V, mask=MASK, block_q=16, block_k=16)
  chex.assert_shape(out, (B, H, T, D))
  want = attention.dense_attention(Q, K, V, mask=MASK)
  np.testing.assert_allclose(out, want, atol=2e-5)


def test_causal_outputs_ignore_future_tokens():
  out = gpu_attention.pallas_gpu_attention(Q, K, V, mask=MASK, block_q=16, block_k=16)
  changed = gpu_attention.pallas_gpu_attention(Q, K.at[:, :, 20:].set(7.0),
                                               V.at[:, :, 20:].set(-3.0), mask=MASK,
                                               block_q=16, block_k=16)
  np.testing.assert_allclose(out[:, :, :20], changed[:, :, :20], atol=1e-6)
  assert not np.allclose(out[:, :, 20:], changed[:, :, 20:])


def test_blocks_are_powers_of_two_for_triton():
  assert gpu_attention.gpu_block(64, 37) == 64
  assert gpu_attention.gpu_block(64, 5) == 16  # one tile, at least Triton's 16
  assert gpu_attention.gpu_block(512, 4096) == gpu_attention.MAX_TRITON_BLOCK == 128
  assert gpu_attention.gpu_block(100, 1000) == 64  # rounded down to a power of two
  assert gpu_attention.gpu_block(128, 4096) == 128


def test_lowers_for_cuda_as_triton_kernels():
  """Forward, dQ and dK/dV kernels each become one Triton call in the CUDA program."""
  tile_bias, params, _ = _case('kerple')
  bf16 = lambda x: x.astype(jnp.bfloat16)  # pylint: disable=unnecessary-lambda-assignment

  def loss(q, k, v, p):
    out = gpu_attention.pallas_gpu_attention(q, k, v, mask=MASK, tile_bias=tile_bias,
                                             bias_params_HxP=p)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(
      bf16(Q), bf16(K), bf16(V), params).lower(lowering_platforms=('cuda',))
  assert lowered.as_text().count('__gpu$xla.gpu.triton') == 3


def _model_config(impl, encoding='kerple', **kw):
  return config_lib.ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4,
                                ffn_size=64, max_position=64,
                                position_encoding=encoding, attention_impl=impl, block_size=16,
                                **kw)


def test_model_with_pallas_gpu_equals_dense():
  tokens = jnp.asarray(_RNG.integers(1, 64, (2, 29)), jnp.int32)
  dense = model_lib.Transformer(_model_config('dense'))
  params = dense.init(jax.random.PRNGKey(0), tokens)['params']
  gpu = model_lib.Transformer(_model_config('pallas_gpu'))
  np.testing.assert_allclose(gpu.apply({'params': params}, tokens),
                             dense.apply({'params': params}, tokens), atol=2e-4)


@pytest.mark.parametrize('encoding, platform, dtype, want', [
    ('rope', 'gpu', 'bfloat16', 'cudnn'), ('rope', 'gpu', 'float32', 'pallas_gpu'),
    ('bipe_alibi', 'cuda', 'bfloat16', 'pallas_gpu'), ('kerple', 'tpu', 'bfloat16', 'pallas'),
    ('dape_kerple', 'gpu', 'bfloat16', 'blockwise'),  # its Triton kernel: explicit only
    ('dape_fire', 'gpu', 'bfloat16', 'blockwise'),
    ('fire', 'tpu', 'float32', 'blockwise'),
    ('bipe_rope', 'cpu', 'float32', 'blockwise')])
def test_auto_picks_by_platform(encoding, platform, dtype, want):
  scheme = schemes.get_scheme(encoding)
  assert attention_support.resolve_attention_impl('auto', scheme, platform, dtype) == want
  assert attention_support.resolve_attention_impl('dense', scheme, platform, dtype) == 'dense'


def test_tile_bias_impls_refuse_other_biases_in_one_line():
  with pytest.raises(ValueError, match="attention_impl='pallas_gpu'.*not 'dapev2_kerple'"):
    config_lib.validate_model_config(_model_config('pallas_gpu', encoding='dapev2_kerple'))


@pytest.mark.slow
def test_lowered_inside_the_151m_training_step_for_cuda():
  """The 151M bipe_alibi step (one H100's share of h100:8) lowered for CUDA runs its attention
  as Triton kernels."""
  config = paper_151m.get_config('bipe_alibi')
  with config.unlocked():
    config.model.attention_impl = 'pallas_gpu'
    config.model.dtype = 'bfloat16'
    config.data.seq_len = 1024
  report = aot_compile.lower_for_cuda(config, 'h100:8')
  summary = report.steps[0].lowered_summary
  assert summary['attention'] == 'Pallas Triton kernel'
  # the scanned layer body once: its forward, the forward recomputed by remat='full', dQ, dK/dV
  assert config.model.scan_layers and config.model.remat == 'full'
  assert summary['custom_calls']['__gpu$xla.gpu.triton'] == 4
