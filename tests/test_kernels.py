"""bipe_jax.kernels: the portable and cpu paths compute the same losses and gradients for every
encoding; 'auto' resolves by the platform of the devices the step runs on."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import config as config_lib
from bipe_jax import kernels
from bipe_jax.config import ModelConfig
from bipe_jax.model import Transformer
from bipe_jax.schemes import SCHEME_NAMES
from bipe_jax.training import chunked_loss
from bipe_jax.training import train_step

B, T, V = 2, 16, 48
SEP, BOS = (3, 5), 1
TINY = ModelConfig(vocab_size=V, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                   ffn_size=64, max_intra=16, max_position=32, train_length=16,
                   separator_ids=SEP, bos_id=BOS, attention_impl='dense', fire_hidden=8,
                   dape_hidden=8, t5_buckets=8, t5_max_distance=16)


def _tokens():
  """Random ids in [6, V) with separators about every 4 tokens (so BiPE has segments)."""
  rng = np.random.default_rng(0)
  tok = rng.integers(6, V, size=(B, T))
  seps = rng.random((B, T)) < 0.25
  tok[seps] = rng.choice(SEP, size=int(seps.sum()))
  return jnp.asarray(tok, jnp.int32)


def _loss(cfg: ModelConfig, params, tokens):
  """The training loss (hidden states into the chunked head + loss, two chunks) of `cfg`."""
  hidden = Transformer(cfg).apply({'params': params}, tokens, return_hidden=True)
  targets, valid = train_step.scored_targets(tokens)
  return chunked_loss.lm_head_nll_sum(hidden, params['lm_head']['kernel'], targets,
                                      valid.astype(jnp.float32), T // 2, cfg.compute_dtype,
                                      cfg.kernels) / jnp.sum(valid)


@functools.lru_cache(maxsize=None)
def _both_paths() -> dict:
  """{encoding: {'portable' | 'cpu': (loss, grads)}} for every encoding, from ONE compiled
  program (one compile of 17 models costs about half of 17 compiles), the parameters
  initialised inside it."""

  @jax.jit
  def all_encodings(tokens):
    out = {}
    for name in SCHEME_NAMES:
      cfg = config_lib.validate_model_config(dataclasses.replace(TINY, position_encoding=name))
      params = nn.meta.unbox(Transformer(cfg).init(jax.random.PRNGKey(0), tokens)['params'])
      out[name] = {k: jax.value_and_grad(_loss, argnums=1)(
          dataclasses.replace(cfg, kernels=k), params, tokens) for k in ('portable', 'cpu')}
    return out

  return jax.device_get(all_encodings(_tokens()))


@pytest.mark.parametrize('name', SCHEME_NAMES)
def test_portable_and_cpu_paths_give_the_same_loss_and_gradients(name):
  out = _both_paths()[name]
  (loss_p, grads_p), (loss_c, grads_c) = out['portable'], out['cpu']
  assert np.isfinite(loss_p) and 2.0 < loss_p < 6.0  # about log(V) = 3.9 at init
  np.testing.assert_allclose(loss_p, loss_c, rtol=1e-6)
  flat_p = jax.tree_util.tree_leaves_with_path(grads_p)
  flat_c = jax.tree.leaves(grads_c)
  assert len(flat_p) == len(flat_c)
  scale = max(float(np.max(np.abs(g))) for g in flat_c)  # (FIRE's output bias gets ~0)
  for (path, g_p), g_c in zip(flat_p, flat_c):
    np.testing.assert_allclose(g_p, g_c, rtol=1e-4, atol=1e-6 * scale,
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize('platform, expected', [('cpu', 'cpu'), ('tpu', 'portable'),
                                                ('gpu', 'portable'), ('cuda', 'portable')])
def test_auto_resolves_to_cpu_only_on_cpu_devices(platform, expected):
  assert kernels.resolve_kernels('auto', platform) == expected
  assert kernels.resolve_kernels('portable', platform) == 'portable'
  assert kernels.resolve_kernels('cpu', platform) == 'cpu'


def test_a_bad_name_is_one_clear_error():
  with pytest.raises(ValueError, match=r"model.kernels='gpu' is invalid"):
    kernels.resolve_kernels('gpu', 'cpu')
  with pytest.raises(ValueError, match='model.kernels'):
    config_lib.validate_model_config(dataclasses.replace(TINY, kernels='fast'))
