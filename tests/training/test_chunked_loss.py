"""The lm head and next-token loss computed in chunks (bipe_jax.training.chunked_loss) against a
float64 NumPy loop and against plain autodiff of the materialised logits; the training step with
it against the training step without it."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from bipe_jax import model as model_lib
from bipe_jax.training import chunked_loss
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer
from bipe_jax.state import train_state
from bipe_jax.training import train_step
from tests.fixtures import tiny_model_config

B, T, D, V = 3, 8, 5, 11


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  hidden = rng.normal(size=(B, T, D)).astype(np.float32)
  kernel = (rng.normal(size=(D, V)) * 0.7).astype(np.float32)
  targets = rng.integers(0, V, size=(B, T)).astype(np.int32)
  weights = rng.choice([0.0, 0.5, 1.0], size=(B, T)).astype(np.float32)
  return hidden, kernel, targets, weights


def _loop_reference(hidden, kernel, targets, weights) -> float:
  """One position at a time, float64: sum of w * (log sum exp(logits) - logits[target])."""
  total = 0.0
  for b in range(hidden.shape[0]):
    for t in range(hidden.shape[1]):
      logits = [sum(float(hidden[b, t, d]) * float(kernel[d, v]) for d in range(hidden.shape[2]))
                for v in range(kernel.shape[1])]
      top = max(logits)
      log_z = top + math.log(sum(math.exp(x - top) for x in logits))
      total += float(weights[b, t]) * (log_z - logits[int(targets[b, t])])
  return total


def _plain(hidden, kernel, targets, weights, dtype=jnp.float32):
  logits = jnp.einsum('btd,dv->btv', hidden.astype(dtype), kernel.astype(dtype)).astype(jnp.float32)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * weights)


def test_chunk_length_is_the_largest_divisor_within_the_budget():
  assert chunked_loss.chunk_length(16, 128, 512) == 32
  assert chunked_loss.chunk_length(16, 64, 512) == 32
  assert chunked_loss.chunk_length(1, 96, 40) == 32
  assert chunked_loss.chunk_length(1, 7, 6) == 1  # 7 is prime: one position at a time
  assert chunked_loss.chunk_length(1000, 64, 512) == 1  # more rows than the budget
  assert chunked_loss.chunk_length(2, 64, 10 ** 6) == 64  # everything in one chunk
  with pytest.raises(ValueError, match='must all be >= 1'):
    chunked_loss.chunk_length(4, 64, 0)


@pytest.mark.parametrize('chunk_len', [1, 2, 4, 8])
@pytest.mark.parametrize('use_jit', [False, True])
def test_loss_equals_a_float64_loop(chunk_len, use_jit):
  hidden, kernel, targets, weights = _inputs()
  fn = lambda h, k, t, w: chunked_loss.lm_head_nll_sum(h, k, t, w, chunk_len)
  if use_jit:
    fn = jax.jit(fn)
  got = fn(*map(jnp.asarray, (hidden, kernel, targets, weights)))
  chex.assert_shape(got, ())
  chex.assert_type(got, jnp.float32)
  np.testing.assert_allclose(float(got), _loop_reference(hidden, kernel, targets, weights),
                             rtol=1e-5)


@pytest.mark.parametrize('chunk_len, kernels', [(1, 'cpu'), (4, 'cpu'), (8, 'cpu'),
                                               (1, 'portable'), (8, 'portable')])
def test_gradients_equal_autodiff_of_the_materialised_logits(chunk_len, kernels):
  """On both kernels paths (bipe_jax.kernels: how the hidden states enter the kernel's
  gradient)."""
  args = tuple(map(jnp.asarray, _inputs(seed=1)))
  h, k, t, w = args
  scaled = lambda f: (lambda h, k, w: 2.5 * f(h, k, t, w))  # a cotangent other than 1
  chunked = scaled(lambda h, k, t, w: chunked_loss.lm_head_nll_sum(h, k, t, w, chunk_len,
                                                                   kernels=kernels))
  want_val, want = jax.value_and_grad(scaled(_plain), argnums=(0, 1, 2))(h, k, w)
  got_val, got = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1, 2)))(h, k, w)
  np.testing.assert_allclose(got_val, want_val, rtol=1e-5)
  for g, e, shape in zip(got, want, ((B, T, D), (D, V), (B, T))):
    chex.assert_shape(g, shape)
    np.testing.assert_allclose(g, e, rtol=2e-5, atol=1e-5)


def test_bfloat16_matmul_matches_the_plain_bfloat16_head():
  h, k, t, w = map(jnp.asarray, _inputs(seed=2))
  want, want_g = jax.value_and_grad(_plain, argnums=(0, 1))(h, k, t, w, jnp.bfloat16)
  got, got_g = jax.value_and_grad(
      lambda h, k: chunked_loss.lm_head_nll_sum(h, k, t, w, 4, jnp.bfloat16), argnums=(0, 1))(
          h, k)
  np.testing.assert_allclose(got, want, rtol=2e-3)
  for g, e in zip(got_g, want_g):
    np.testing.assert_allclose(g, e, rtol=3e-2, atol=3e-2)
    assert float(jnp.max(jnp.abs(g))) > 0


def test_bad_inputs_name_the_problem():
  h, k, t, w = map(jnp.asarray, _inputs())
  with pytest.raises(ValueError, match='chunk_len=3 does not divide the sequence length 8'):
    chunked_loss.lm_head_nll_sum(h, k, t, w, 3)
  with pytest.raises(ValueError, match='weights must be floating point'):
    chunked_loss.lm_head_nll_sum(h, k, t, w > 0, 4)
  with pytest.raises(ValueError, match=r'hidden \[B, T, D\], targets and weights \[B, T\]'):
    chunked_loss.lm_head_nll_sum(h, k, t[:, :4], w, 4)


def _tiny_model():
  return model_lib.Transformer(tiny_model_config(
      vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, ffn_size=32,
      max_intra=16, max_position=32, train_length=12, separator_ids=(3,), pad_id=0,
      position_encoding='bipe_rope', attention_impl='dense'))


def test_training_step_with_chunks_equals_the_plain_step():
  """Two steps, padded targets and an output-only loss mask: same losses, gradient norms and
  parameters as the step that materialises the logits."""
  model = _tiny_model()
  config = base.get_base_config()
  config.train.learning_rate, config.train.warmup_steps = 1e-2, 1
  tx, lr = optimizer.make_optimizer(config.train), optimizer.learning_rate_schedule(config.train)
  mesh = mesh_lib.make_mesh(config.mesh, devices=jax.devices()[:1])
  rng = np.random.default_rng(3)
  tokens = rng.integers(1, 40, size=(4, 12)).astype(np.int32)
  tokens[0, 9:] = 0  # padding: not scored
  mask = np.ones_like(tokens, bool)
  mask[1, :5] = False  # an input part: not learned
  batch = {'tokens': jnp.asarray(tokens), 'loss_mask': jnp.asarray(mask)}
  results = []
  for chunk_tokens in (0, 8):  # 0 = plain logits; 8 tokens = 2 positions x 4 rows per chunk
    state, shardings = train_state.create_train_state(model, tx, mesh, 12, seed=0)
    step = train_step.make_train_step(model, tx, lr, mesh, shardings, pad_id=0,
                                      loss_chunk_tokens=chunk_tokens)
    history = []
    with train_state.mesh_context(mesh):
      for _ in range(2):
        state, metrics = step(state, batch)
        history.append([float(metrics[k]) for k in ('loss', 'grad_norm', 'targets')])
    results.append((history, jax.device_get(state.params)))
  np.testing.assert_allclose(results[1][0], results[0][0], rtol=2e-5)
  assert results[0][0][0][2] == 4 * 11 - 3 - 4  # last column, 3 pad targets, 4 masked
  # Adam divides each gradient by its own magnitude, so a parameter whose gradient is ~0 moves
  # by ~lr whatever the rounding of that gradient: atol 2e-5 absorbs that (observed 2e-6), a
  # wrong gradient moves parameters by ~lr = 1e-2.
  chex.assert_trees_all_close(results[1][1], results[0][1], atol=2e-5, rtol=1e-5)
  moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), results[0][1],
                       jax.device_get(train_state.create_train_state(
                           model, tx, mesh, 12, seed=0)[0].params))
  assert max(jax.tree.leaves(moved)) > 1e-3  # the steps did change the parameters


def test_a_model_that_only_returns_logits_gets_the_plain_loss():
  """make_train_step keeps working for any linen model (no return_hidden, no lm_head param)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  class Bigram(nn.Module):
    @nn.compact
    def __call__(self, tokens_BxT):
      return nn.Embed(40, 40)(tokens_BxT)

  config = base.get_base_config()
  tx, lr = optimizer.make_optimizer(config.train), optimizer.learning_rate_schedule(config.train)
  mesh = mesh_lib.make_mesh(config.mesh, devices=jax.devices()[:1])
  state, shardings = train_state.create_train_state(Bigram(), tx, mesh, 6, seed=0)
  step = train_step.make_train_step(Bigram(), tx, lr, mesh, shardings, loss_chunk_tokens=512)
  tokens = jnp.asarray(np.arange(24).reshape(4, 6) % 40, jnp.int32)
  with train_state.mesh_context(mesh):
    _, metrics = step(state, {'tokens': tokens})
  np.testing.assert_allclose(float(metrics['loss']), math.log(40), rtol=1e-2)


def test_config_rejects_a_negative_chunk():
  from bipe_jax import run_config  # pylint: disable=g-import-not-at-top
  t = base.get_base_config().train
  assert t.loss_chunk_tokens > 0  # on by default
  t.loss_chunk_tokens = -1
  with pytest.raises(run_config.ConfigError, match='train.loss_chunk_tokens=-1'):
    run_config.section_from_dict('train', t)
  t.loss_chunk_tokens = 0
  assert run_config.section_from_dict('train', t).loss_chunk_tokens == 0
