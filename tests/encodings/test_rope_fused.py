"""rope.rotate_fused (the rotary in one pass that XLA fuses, issue 53) against the loop-based
NumPy rotation, against rope.rotate (the same floating-point operations: equal to the bit),
its gradient against the inverse rotation, the model's Pallas path (which uses it, and under
remat 'save_projections' keeps its output) against dense attention, and (libtpu) the TPU program
of the rotation: no float32 half of the head dimension is materialised."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax.encodings import rope
from tests import reference_numpy as ref
from tests.attention.test_pallas_attention import assert_kernel_model_equals_dense

RNG = np.random.default_rng(53)
X = RNG.normal(size=(2, 3, 7, 8)).astype(np.float32)
G = RNG.normal(size=(2, 3, 7, 8)).astype(np.float32)
POS = RNG.integers(0, 300, (2, 7)).astype(np.int32)
INV = rope.rope_inv_frequencies(8, scaling='yarn', factor=2.0, original_length=16)
SCALE = rope.rope_attention_scale('yarn', 2.0)


def _tables():
  return rope.rope_cos_sin(jnp.asarray(POS), INV, SCALE)


def test_values_equal_the_reference_and_rotate_to_the_bit():
  cos, sin = _tables()
  out = rope.rotate_fused(jnp.asarray(X), cos, sin)
  np.testing.assert_allclose(out, ref.rope_ref(X, POS, INV, SCALE), rtol=2e-5, atol=2e-5)
  for dtype in (jnp.float32, jnp.bfloat16):
    x = jnp.asarray(X, dtype)
    got = rope.rotate_fused(x, cos, sin)
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(rope.rotate(x, cos, sin), np.float32))


def test_gradient_is_the_inverse_rotation_and_equals_autodiff_of_rotate():
  cos, sin = _tables()
  _, vjp = jax.vjp(lambda x: rope.rotate_fused(x, cos, sin), jnp.asarray(X))
  # the rotation is linear and orthogonal up to the scale: its transpose turns by -angle
  np.testing.assert_allclose(vjp(jnp.asarray(G))[0], ref.rope_ref(G, -POS, INV, SCALE),
                             rtol=2e-5, atol=2e-5)
  for dtype in (jnp.float32, jnp.bfloat16):
    x, g = jnp.asarray(X, dtype), jnp.asarray(G, dtype)
    got = jax.vjp(lambda x: rope.rotate_fused(x, cos, sin), x)[1](g)[0]
    want = jax.vjp(lambda x: rope.rotate(x, cos, sin), x)[1](g)[0]
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_under_jit_with_tables_broadcast_over_the_batch():
  cos, sin = rope.rope_cos_sin(jnp.arange(7)[None], INV)  # [1, 1, T, Dh]
  fn = jax.jit(jax.value_and_grad(lambda x: jnp.sum(rope.rotate_fused(x, cos, sin) * G)))
  value, grad = fn(jnp.asarray(X))
  pos = np.broadcast_to(np.arange(7), (2, 7))
  np.testing.assert_allclose(value, np.sum(ref.rope_ref(X, pos, INV) * G), rtol=1e-5)
  np.testing.assert_allclose(grad, ref.rope_ref(G, -pos, INV), rtol=2e-5, atol=2e-5)


def _model(name, impl, remat):
  fields = dict(vocab_size=16, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                ffn_size=64, position_encoding=name, separators='ids', separator_ids=(3, 4),
                max_intra=64, max_position=64, block_size=8, attention_impl=impl,
                remat=remat)
  if name == 'bipe3_rope':
    fields.update(paragraph_ids=(5,))
  return model_lib.Transformer(config_lib.model_config_from_dict(fields))


@pytest.mark.parametrize('name', ['bipe_rope', 'bipe3_rope'])
def test_model_on_the_kernel_path_with_saved_rotations_equals_dense(name):
  tokens = jnp.asarray(RNG.integers(0, 16, (2, 16)), jnp.int32)
  dense = _model(name, 'dense', 'none')
  kernel = _model(name, 'pallas', 'save_projections')
  params = dense.init(jax.random.PRNGKey(0), tokens)['params']

  def loss(model, p):
    return jnp.mean(jax.nn.log_softmax(model.apply({'params': p}, tokens)).max(-1))

  assert_kernel_model_equals_dense(dense, kernel, loss, params)


_F32 = re.compile(r'f32\[([0-9,]+)\]')


def _is_half_of(shape_text: str, x_shape) -> bool:
  """Whether an f32[...] of the HLO is half of x: as many elements as x over 2, one axis of
  Dh / 2 (any order of the axes)."""
  dims = [int(d) for d in shape_text.split(',')]
  return int(np.prod(dims)) * 2 == int(np.prod(x_shape)) and x_shape[-1] // 2 in dims


@pytest.mark.slow  # four small TPU compiles
def test_tpu_program_materialises_no_float32_halves():
  pytest.importorskip('libtpu', reason='the TPU compiler (requirements-tpu.txt) is not installed')
  from bipe_jax.compile import topologies  # pylint: disable=g-import-not-at-top
  one = jax.sharding.SingleDeviceSharding(topologies.topology_devices('v5e:2x2')[0])
  x = jax.ShapeDtypeStruct((2, 4, 256, 64), jnp.bfloat16, sharding=one)
  table = jax.ShapeDtypeStruct((2, 1, 256, 64), jnp.float32, sharding=one)

  def materialised_halves(rotate):
    def fwd_and_bwd(x, cos, sin):
      out, vjp = jax.vjp(lambda x: rotate(x, cos, sin), x)
      return out, vjp(out)[0]
    text = jax.jit(fwd_and_bwd).trace(x, table, table).lower(
        lowering_platforms=('tpu',)).compile().as_text()
    # top-level instructions only (a fusion's inner values stay in registers / VMEM)
    entry = text[text.index('\nENTRY'):]
    results = [line.split('=', 1)[1].split('(')[0] for line in entry.splitlines() if '=' in line]
    return [r for r in results
            if any(_is_half_of(m, x.shape) for m in _F32.findall(r))]

  assert materialised_halves(rope.rotate)  # what issue 53 found: the halves in HBM
  assert not materialised_halves(rope.rotate_fused)
