"""Kerple's p and a stay >= 0.01 and stay learnable (issue: a head initialised below froze)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import config as model_config_lib
from bipe_jax import model as model_lib
from bipe_jax.encodings import kerple
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer
from bipe_jax.state import train_state
from bipe_jax.training import train_step
from configs import base

SEQ = 16


def tiny_config(encoding):
  c = base.get_base_config()
  m = c.model
  m.position_encoding, m.vocab_size, m.hidden_size, m.num_layers = encoding, 64, 32, 2
  m.num_heads, m.ffn_size, m.max_intra, m.max_position, m.block_size = 4, 64, SEQ, SEQ, SEQ
  m.separators, m.separator_ids = 'ids', (3,)
  c.data.seq_len = SEQ
  c.train.batch_size, c.train.learning_rate, c.train.warmup_steps = 4, 1e-2, 1
  return c


def test_straight_through_clamp_forward_and_gradient():
  x = jnp.array([0.001, 0.5, -0.2])
  np.testing.assert_allclose(kerple.clamp_straight_through(x, 0.01), [0.01, 0.5, 0.01], rtol=1e-6)
  grad = jax.grad(lambda v: jnp.sum(3.0 * kerple.clamp_straight_through(v, 0.01)))(x)
  np.testing.assert_allclose(grad, [3.0, 3.0, 3.0])  # max() would give [0, 3, 0]


def test_projection_touches_only_kerple_parameters():
  params = {'layer_0': {'attention': {'kerple': {'p': jnp.array([-1.0, 0.5]),
                                                 'a': jnp.array([0.001, 2.0])},
                                      'query': {'kernel': jnp.array([-1.0])}}}}
  out = optimizer.project_parameters(params)
  np.testing.assert_allclose(out['layer_0']['attention']['kerple']['p'], [0.01, 0.5])
  np.testing.assert_allclose(out['layer_0']['attention']['kerple']['a'], [0.01, 2.0])
  np.testing.assert_allclose(out['layer_0']['attention']['query']['kernel'], [-1.0])


@pytest.mark.parametrize('encoding', ['kerple', 'dape_kerple', 'bipe_kerple'])
def test_a_head_initialised_below_the_clamp_learns(encoding):
  c = tiny_config(encoding)
  model = model_lib.Transformer(model_config_lib.model_config_from_dict(c.model))
  tx = optimizer.make_optimizer(c.train)
  mesh = mesh_lib.make_mesh(c.mesh, devices=jax.devices()[:1])
  state, shardings = train_state.create_train_state(model, tx, mesh, SEQ, 0)
  params = jax.tree.map(np.array, jax.device_get(state.params))  # writable copies
  for name in kerple.KERPLE_PARAM_NAMES:  # head 0 of layer 0 starts below the clamp
    params['layer_0']['attention']['kerple'][name][0] = 0.002
  state = state.replace(params=jax.device_put(params, shardings.params))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (4, SEQ), 4, 64, dtype=jnp.int32)
  tokens = tokens.at[:, 5].set(3)
  with train_state.mesh_context(mesh):
    step = train_step.make_train_step(model, tx, optimizer.learning_rate_schedule(c.train),
                                      mesh, shardings, loss_chunk_tokens=0)
    batch = {'tokens': jax.device_put(tokens, mesh_lib.batch_sharding(mesh))}
    values = []
    for _ in range(6):
      state, _ = step(state, batch)
      values.append({n: float(state.params['layer_0']['attention']['kerple'][n][0])
                     for n in kerple.KERPLE_PARAM_NAMES})
  for name in kerple.KERPLE_PARAM_NAMES:
    seen = [v[name] for v in values]
    assert min(seen) >= kerple.KERPLE_MIN - 1e-7  # projected back after every update
    assert len(set(seen)) > 1, f'{name} of the head below the clamp never moved: {seen}'
