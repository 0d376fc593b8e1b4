"""The fused DAPE V1 GPU (Triton) kernels, in interpret mode on CPU (float32), equal dense
attention with `dape_v1_transform` in values and gradients (q, k, v, every DAPE parameter,
Kerple's p and a), with causal masking, two documents per row, a padded tail, a ragged length
and GQA, for Kerple (the MLP reading scores and bias, C = 2H) and ALiBi (scores only, C = H, on
a one-device mesh); V2, other biases, mask_fn and non-causal masks are refused in one line; the
kernels lower for CUDA as three Triton calls on a CPU host."""

import contextlib
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import attention
from bipe_jax.attention.pallas import dape_tile
from bipe_jax.attention.pallas import gpu_dape_attention
from bipe_jax.attention.pallas import gpu_dape_tiles
from bipe_jax.attention.pallas.tile_bias import TileBias
from bipe_jax.encodings import alibi
from bipe_jax.encodings import dape
from bipe_jax.encodings import kerple
from tests.attention import dape_cases

B, H, T, D, N = 2, 2, 45, 16, 4  # T: ragged (3 tiles of 16 inside)
_RNG = np.random.default_rng(0)
POS = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
DOC = jnp.asarray([[0] * 20 + [1] * 25, [0] * 33 + [1] * 12], jnp.int32)  # two documents
VALID = jnp.asarray([[True] * T, [True] * 38 + [False] * 7])  # padded tail in row 1
COTANGENT = jnp.asarray(_RNG.normal(size=(B, H, T, D)), jnp.float32)
INTER = jnp.asarray(np.cumsum(_RNG.random((B, T)) < 0.3, axis=1), jnp.int32)  # a bias stream
MASK = attention.AttentionMask(q_pos=POS, k_pos=POS, k_valid=VALID, q_document=DOC,
                               k_document=DOC)


def _qkv(g):
  return tuple(jnp.asarray(_RNG.normal(size=s), jnp.float32)
               for s in ((B, H, T, D), (B, g, T, D), (B, g, T, D)))


def _dape_params(features):
  return dape_cases.dape_params(_RNG, features, N, H)


def _case(kind):
  """(TileBias, raw bias parameters, raw -> kernel params [H, P], raw -> bias_fn)."""
  return dape_cases.bias_case(_RNG, kind, H)


def _losses(kind, batch_axes=None, block=16, stream=None):
  tile_bias, _, kernel_params, bias_fn = _case(kind)

  def gpu_loss(q, k, v, dp, r):
    out = gpu_dape_attention.pallas_gpu_dape_attention(
        q, k, v, mask=MASK, dape_params=dp, tile_bias=tile_bias,
        bias_params_HxP=kernel_params(r), q_streams=stream, k_streams=stream, block_q=block,
        block_k=block, batch_axes=batch_axes)
    return jnp.sum(out * COTANGENT), out

  def dense_loss(q, k, v, dp, r):
    transform = lambda s, b, *_: dape.dape_v1_transform(s, b, dp)
    out = attention.dense_attention(q, k, v, mask=MASK, q_streams=stream, k_streams=stream,
                                    bias_fn=bias_fn(r), transform_fn=transform)
    return jnp.sum(out * COTANGENT), out

  return gpu_loss, dense_loss


@pytest.mark.parametrize('kind,features,g', [('kerple', 2 * H, 1), ('alibi', H, 2)])
def test_values_and_gradients_equal_dense(kind, features, g):
  """kerple: the MLP reads scores and bias, GQA (2 query heads per KV head), 16-token tiles;
  alibi: the scores only, one KV head per query head, 32-token tiles, the bias reading its own
  stream (q_streams / k_streams), per shard of a (one-device) mesh."""
  on_mesh = kind == 'alibi'
  gpu_loss, dense_loss = _losses(kind, batch_axes='data' if on_mesh else None,
                                 block=32 if on_mesh else 16,
                                 stream=INTER if on_mesh else None)
  args = (*_qkv(g), _dape_params(features), _case(kind)[1])
  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4), has_aux=True))
  mesh = jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  with jax.set_mesh(mesh) if on_mesh else contextlib.nullcontext():
    (_, got), g_got = grad(gpu_loss)(*args)
  (_, want), g_want = grad(dense_loss)(*args)
  chex.assert_shape(got, (B, H, T, D))
  chex.assert_trees_all_equal_shapes_and_dtypes(g_got, g_want)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  assert float(jnp.max(jnp.abs(got[1, :, 38:]))) > 0  # padded keys: real queries still attend
  dape_cases.assert_gradients_equal(kind, g_got, g_want)
  assert float(jnp.max(jnp.abs(g_got[3]['w_in']))) > 0  # the MLP's gradient is not trivial
  if kind == 'kerple':  # p[0] is below the clamp: the gradient passes straight through
    assert float(jnp.abs(g_got[4]['p'][0])) > 0


def test_refusals_are_one_line():
  q, k, v = _qkv(1)
  bias = jnp.ones((H, 2))
  v2 = dict(w_in=jnp.zeros((3, 2 * H, N)), b_in=jnp.zeros(N), w_out=jnp.zeros((3, N, H)),
            b_out=jnp.zeros(H))
  call = functools.partial(gpu_dape_attention.pallas_gpu_dape_attention, q, k, v)
  cases = [
      (dict(mask=MASK, dape_params=v2, bias_params_HxP=bias), 'fuses DAPE V1 only'),
      (dict(mask=MASK, dape_params=_dape_params(2 * H), tile_bias=TileBias('fox')),
       "bias 'fox' is not one of"),
      (dict(mask=MASK, dape_params=_dape_params(3), bias_params_HxP=bias), 'needs C = 2H'),
      (dict(mask=attention.AttentionMask(q_pos=POS, k_pos=POS, causal=False),
            dape_params=_dape_params(2 * H), bias_params_HxP=bias), 'causal only'),
      (dict(mask=attention.AttentionMask(q_pos=POS, k_pos=POS, mask_fn=lambda *a: True),
            dape_params=_dape_params(2 * H), bias_params_HxP=bias), 'no mask.mask_fn'),
  ]
  for kwargs, says in cases:
    with pytest.raises(ValueError, match=says) as e:
      call(**kwargs)
    assert '\n' not in str(e.value)


def test_packed_parameters_are_padded_to_a_power_of_two():
  flat = dape_tile.FlatParams(2 * H, N, H, 2)
  assert flat.size == 2 * H * N + N + N * H + H + 2 * H == 34
  assert gpu_dape_tiles.padded_size(flat) == 64
  assert gpu_dape_tiles.padded_size(dape_tile.FlatParams(2, 3, 1, 1)) == 16  # 6+3+3+1+1 = 14


def test_lowers_for_cuda_as_triton_kernels():
  """Forward, dQ (with the parameters) and dK / dV each become one Triton call."""
  tile_bias, raw, kernel_params, _ = _case('kerple')
  bf16 = lambda x: x.astype(jnp.bfloat16)  # pylint: disable=unnecessary-lambda-assignment
  mask = attention.AttentionMask.causal_from_positions(POS)

  def loss(q, k, v, dp, r):
    out = gpu_dape_attention.pallas_gpu_dape_attention(
        q, k, v, mask=mask, dape_params=dp, tile_bias=tile_bias,
        bias_params_HxP=kernel_params(r))
    return jnp.sum(out.astype(jnp.float32) ** 2)

  q, k, v = _qkv(1)
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))).trace(
      bf16(q), bf16(k), bf16(v), _dape_params(2 * H), raw).lower(lowering_platforms=('cuda',))
  assert lowered.as_text().count('__gpu$xla.gpu.triton') == 3
