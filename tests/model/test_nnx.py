"""The linen Transformer and the encodings' linen modules run from Flax NNX through
`nnx.bridge.ToNNX` without a mesh (plain parameters; logical-axis names only under a mesh),
and give the same outputs as the linen modules with the same parameters."""

import flax.linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import encodings as E
from bipe_jax import model as model_lib
from bipe_jax.config import ModelConfig

SEP = (3,)
CFG = ModelConfig(vocab_size=32, hidden_size=32, num_layers=1, num_heads=2, ffn_size=64,
                  max_intra=16, separator_ids=SEP, attention_impl='dense')
B, T, H = 2, 12, 2


def _tokens():
  tok = np.random.default_rng(0).integers(4, 32, size=(B, T))
  tok[:, ::4] = SEP[0]
  return jnp.asarray(tok, jnp.int32)


def _positions():
  rng = np.random.default_rng(1)
  return (jnp.asarray(rng.integers(0, 40, (B, 5))), jnp.asarray(rng.integers(0, 40, (B, 7))))


def _bridged(module: nn.Module, *args):
  """(NNX model, its params as a linen params dict, NNX output) for `module(*args)`."""
  wrapped = nnx.bridge.ToNNX(module, rngs=nnx.Rngs(0))
  nnx.bridge.lazy_init(wrapped, *args)
  out = wrapped(*args)
  params = nnx.state(wrapped, nnx.Param).to_pure_dict()
  return wrapped, params, out


def test_the_transformer_runs_from_nnx_without_a_mesh_and_matches_linen():
  assert jax.sharding.get_abstract_mesh().empty
  module = model_lib.Transformer(CFG)
  tokens = _tokens()
  wrapped, params, logits = _bridged(module, tokens)
  assert logits.shape == (B, T, CFG.vocab_size)
  np.testing.assert_allclose(logits, module.apply({'params': params}, tokens), rtol=1e-6)
  # BiPE's separators reach the NNX model: moving a separator changes the logits after it.
  moved = tokens.at[:, 4].set(7)
  assert not np.allclose(nnx.jit(lambda m, t: m(t))(wrapped, moved)[:, 5:], logits[:, 5:],
                         atol=1e-4)
  # Every parameter gets a gradient through nnx.grad.
  grads = nnx.jit(nnx.grad(lambda m: m(tokens).mean()))(wrapped)
  norms = [float(jnp.abs(g).sum()) for g in jax.tree.leaves(grads)]
  assert len(norms) == len(jax.tree.leaves(params)) and all(n > 0 for n in norms)


@pytest.mark.parametrize('make,args', [
    (lambda: E.LearnedPositionEmbedding(16, 8), lambda: (_positions()[0],)),
    (lambda: E.KerpleLogBias(H), _positions),
    (lambda: E.FireBias(H, hidden=8), _positions),
    (lambda: E.T5RelativeBias(H, num_buckets=8, max_distance=16), _positions),
    (lambda: E.DapeV1(H, hidden=8),
     lambda: (jnp.ones((B, H, 5, 5)), jnp.zeros((B, H, 5, 5)))),
    (lambda: E.DapeV2(H, hidden=8),
     lambda: (jnp.ones((B, H, 5, 5)), jnp.zeros((B, H, 5, 5)))),
], ids=['learned', 'kerple', 'fire', 't5', 'dape_v1', 'dape_v2'])
def test_each_encoding_module_runs_from_nnx_and_matches_linen(make, args):
  module, inputs = make(), args()
  _, params, out = _bridged(module, *inputs)
  np.testing.assert_allclose(out, module.apply({'params': params}, *inputs), rtol=1e-6)


def test_parameters_carry_logical_axes_only_under_a_mesh():
  tokens = _tokens()
  init = lambda: model_lib.Transformer(CFG).init(jax.random.PRNGKey(0), tokens)['params']
  plain = jax.eval_shape(init)
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  assert not any(is_box(x) for x in jax.tree.leaves(plain, is_leaf=is_box))
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))
  with jax.set_mesh(mesh):
    boxed = jax.eval_shape(init)
  leaves = jax.tree.leaves(boxed, is_leaf=is_box)
  assert leaves and all(is_box(x) for x in leaves)
  assert tuple(nn.get_partition_spec(boxed)['embed']['embedding']) == ('vocab', 'embed')


def test_a_model_config_validates_itself_when_constructed():
  with pytest.raises(ValueError, match='every token of a bipe_rope model would be in segment 0'):
    ModelConfig(position_encoding='bipe_rope')
  with pytest.raises(ValueError, match=r'model.num_heads=0 is invalid'):
    ModelConfig(position_encoding='rope', num_heads=0)
  assert ModelConfig(position_encoding='rope').separator_ids == ()
  assert ModelConfig(separator_ids=[13, 869]).separator_ids == (13, 869)  # a list becomes a tuple
