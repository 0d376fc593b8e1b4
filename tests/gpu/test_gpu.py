"""The GPU paths on a real CUDA GPU (`make test-gpu`; not part of `make test`, which has none):
cuDNN's fused attention and the Triton tile-bias kernels against dense attention, bf16 training
of a tiny model with falling loss, and the step benchmark at its smallest size."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

if jax.default_backend() != 'gpu':
  pytest.skip('no CUDA GPU: run `make test-gpu` on a GPU host', allow_module_level=True)

# pylint: disable=wrong-import-position
from bipe_jax import attention
from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax.attention import pallas
from bipe_jax.encodings import alibi
from bipe_jax.encodings import kerple
from bipe_jax.encodings import t5
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer
from bipe_jax.state import train_state
from bipe_jax.training import train_step

B, H, G, T, D = 2, 8, 4, 300, 64
_RNG = np.random.default_rng(0)


def _qkv(dtype):
  return tuple(jnp.asarray(_RNG.normal(size=s), dtype)
               for s in ((B, H, T, D), (B, G, T, D), (B, G, T, D)))


POS = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
INTER = jnp.asarray(np.cumsum(_RNG.random((B, T)) < 0.1, axis=1), jnp.int32)
DOC = jnp.asarray([[0] * 140 + [1] * 160, [0] * 300], jnp.int32)


def _bias(kind):
  if kind == 'alibi':
    slopes = alibi.alibi_slopes(H)
    return (pallas.TileBias('alibi'), jnp.asarray(96.0 * slopes)[:, None],
            lambda p: functools.partial(alibi.alibi_bias, slopes_H=slopes, slope_factor=96.))
  if kind == 'kerple':
    return (pallas.TileBias('kerple'), jnp.asarray(_RNG.uniform(0.01, 2.0, (H, 2)), jnp.float32),
            lambda p: lambda qs, ks: kerple.kerple_log_bias(qs, ks, p[:, 0], p[:, 1]))
  return (pallas.TileBias('t5', t5_buckets=32, t5_max_distance=128),
          jnp.asarray(_RNG.normal(size=(H, 32)), jnp.float32),
          lambda p: lambda qs, ks: t5.t5_bias(qs, ks, p.T, 32, 128))


@pytest.mark.parametrize('kind', ['alibi', 'kerple', 't5'])
def test_triton_kernel_equals_dense(kind):
  q, k, v = _qkv(jnp.float32)
  tile_bias, params, bias_fn_of = _bias(kind)
  stream = INTER if kind == 'alibi' else POS
  mask = attention.AttentionMask(q_pos=POS, k_pos=POS, q_document=DOC, k_document=DOC)

  def loss(fn, q, k, v, p):
    return jnp.sum(jnp.sin(fn(q, k, v, p)))

  gpu = lambda q, k, v, p: pallas.pallas_gpu_attention(  # pylint: disable=unnecessary-lambda-assignment
      q, k, v, mask=mask, q_streams=stream, k_streams=stream, tile_bias=tile_bias,
      bias_params_HxP=p)
  dense = lambda q, k, v, p: attention.dense_attention(  # pylint: disable=unnecessary-lambda-assignment
      q, k, v, mask=mask, q_streams=stream, k_streams=stream, bias_fn=bias_fn_of(p))
  argnums = (0, 1, 2) if kind == 'alibi' else (0, 1, 2, 3)
  got = jax.jit(jax.value_and_grad(functools.partial(loss, gpu), argnums=argnums))(q, k, v, params)
  want = jax.jit(jax.value_and_grad(functools.partial(loss, dense), argnums=argnums))(
      q, k, v, params)
  # float32 inputs: Triton's dots run in TF32 on tensor cores
  chex.assert_trees_all_close(got, want, atol=5e-2, rtol=2e-2)
  assert 'triton' in jax.jit(gpu).lower(q, k, v, params).as_text()


def _tiny(impl, encoding, dtype='bfloat16'):
  return config_lib.ModelConfig(vocab_size=256, hidden_size=128, num_layers=2, num_heads=2,
                                ffn_size=256, max_position=256, max_intra=256,
                                position_encoding=encoding, attention_impl=impl, dtype=dtype,
                                separators='ids', separator_ids=(13,), train_length=256,
                                rope_original_length=256, kernels='portable')


@pytest.mark.parametrize('impl, encoding', [('cudnn', 'rope'), ('pallas_gpu', 'bipe_alibi')])
def test_model_impl_equals_dense_in_bf16(impl, encoding):
  tokens = jnp.asarray(_RNG.integers(3, 256, (2, 256)), jnp.int32)
  dense = model_lib.Transformer(_tiny('dense', encoding))
  params = dense.init(jax.random.PRNGKey(0), tokens)['params']
  fused = model_lib.Transformer(_tiny(impl, encoding))
  logits = lambda m: m.apply({'params': params}, tokens).astype(jnp.float32)  # pylint: disable=unnecessary-lambda-assignment
  np.testing.assert_allclose(jax.jit(lambda: logits(fused))(), jax.jit(lambda: logits(dense))(),
                             atol=0.15, rtol=0.05)


@pytest.mark.parametrize('encoding', ['bipe_rope', 'bipe_alibi'])
def test_bf16_training_50_steps_loss_falls(encoding):
  """attention_impl='auto' (cuDNN for bipe_rope, the Triton kernel for bipe_alibi), bf16."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  model = model_lib.Transformer(_tiny('auto', encoding))
  train = ml_collections.ConfigDict(dict(
      learning_rate=3e-3, warmup_steps=5, steps=50, schedule='cosine', end_learning_rate_ratio=0.1,
      weight_decay=0.0, b1=0.9, b2=0.95, eps=1e-8, grad_clip=1.0))
  tx, schedule = optimizer.make_optimizer(train), optimizer.learning_rate_schedule(train)
  mesh = mesh_lib.make_mesh(ml_collections.ConfigDict(dict(data=1, fsdp=1, context=1,
                                                           tensor=1)), jax.devices()[:1])
  state, shardings = train_state.create_train_state(model, tx, mesh, 256, seed=0)
  # a learnable stream: each row repeats a random 16-token motif with separators
  motif = _RNG.integers(14, 256, (8, 16))
  motif[:, 7] = 13
  tokens = jnp.asarray(np.tile(motif, (1, 16)), jnp.int32)
  losses = []
  with train_state.mesh_context(mesh):
    step = train_step.make_train_step(model, tx, schedule, mesh, shardings, loss_chunk_tokens=0)
    for _ in range(50):
      state, metrics = step(state, {'tokens': tokens})
      losses.append(float(metrics['loss']))
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.5 * losses[0], losses
