"""model.remat: none / full / save_projections give the same gradients; what each keeps for the
backward pass (jax.ad_checkpoint.print_saved_residuals) is what bipe_jax/remat.py says."""

import contextlib
import dataclasses
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import config as config_lib
from bipe_jax import remat as remat_lib
from bipe_jax.model import Transformer

CFG = config_lib.ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2,
                             ffn_size=48, position_encoding='rope', attention_impl='dense',
                             max_intra=16, max_position=16)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(2, 12)), jnp.int32)


def _loss(cfg):
  return lambda params: jnp.mean(Transformer(cfg).apply({'params': params}, TOKENS) ** 2)


def _saved(cfg, params) -> str:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(_loss(cfg), params)
  return out.getvalue()


@pytest.fixture(scope='module')
def params():
  return Transformer(CFG).init(jax.random.PRNGKey(0), TOKENS)['params']


@pytest.mark.parametrize('scan', [False, True])
def test_policies_give_the_same_gradients(params, scan):
  cfg = dataclasses.replace(CFG, scan_layers=scan)
  if scan:
    from bipe_jax.model import stack_layer_params  # pylint: disable=import-outside-toplevel
    params = stack_layer_params(params, CFG.num_layers)
  ref = jax.grad(_loss(cfg))(params)
  for policy in ('full', 'save_projections', True):
    got = jax.grad(_loss(dataclasses.replace(cfg, remat=policy)))(params)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_what_each_policy_keeps(params):
  b, t, d, f = 2, 12, CFG.hidden_size, CFG.ffn_size
  none = _saved(CFG, params)
  full = _saved(dataclasses.replace(CFG, remat='full'), params)
  projections = _saved(dataclasses.replace(CFG, remat='save_projections'), params)
  mlp_hidden = f'f32[{b},{t},{f}]'  # gate / up outputs
  # full keeps each layer's input and none of its [B, T, F] activations or projections
  assert mlp_hidden in none and mlp_hidden not in full
  assert f'f32[{b},{t},{d}] output of add' in full
  # save_projections keeps the tagged attention projections (by name) and gate / up (SwiGLU's
  # inputs), per layer; 'down' feeds only the residual add, whose backward does not need it
  for name in ('query', 'key', 'value', 'out'):
    assert projections.count(f"named '{name}'") == CFG.num_layers, name
    assert f"named '{name}'" not in full
  assert projections.count(mlp_hidden) == 2 * CFG.num_layers
  # and not the attention probabilities [B, H, T, T] that none keeps
  scores = f'f32[{b},{CFG.num_heads},{t},{t}]'
  assert scores in none and scores not in projections
  assert len(full.splitlines()) < len(projections.splitlines()) < len(none.splitlines())


def test_remat_names_and_errors():
  assert [remat_lib.remat_name(v) for v in (False, True, 'none', 'full', 'save_projections')] \
      == ['none', 'full', 'none', 'full', 'save_projections']
  with pytest.raises(ValueError, match=r"model.remat='some' is invalid: must be one of"):
    config_lib.validate_model_config(dataclasses.replace(CFG, remat='some'))
