"""The fused DAPE V1 Pallas kernels (interpret mode on CPU, float32) equal dense attention with
`dape_v1_transform`, in values and in gradients (q, k, v, every DAPE parameter, Kerple's p and
a), with causal masking, two documents in a row, a padded tail, a ragged length and GQA, for
Kerple and ALiBi biases, the MLP reading scores and bias (C = 2H) or the scores only (C = H);
V2 is refused in one line; a masked tile is never fetched; the cost estimates count the blocks
the kernels' specs copy; the kernels lower to Mosaic and (libtpu) compile for a v5e chip."""

import contextlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import attention
from bipe_jax.attention.pallas import cost as pallas_cost
from bipe_jax.attention.pallas import dape_attention
from bipe_jax.attention.pallas import dape_cost
from bipe_jax.attention.pallas import dape_forward
from bipe_jax.attention.pallas import dape_tile
from bipe_jax.attention.pallas import layout
from bipe_jax.attention.pallas import tile_ranges
from bipe_jax.attention.pallas.tile_bias import TileBias
from bipe_jax.encodings import alibi
from bipe_jax.encodings import dape
from bipe_jax.encodings import kerple
from tests.attention import dape_cases

B, H, G, T, D, N = 2, 2, 1, 240, 8, 8  # T: ragged (padded to 2 tiles of 128 inside)
_RNG = np.random.default_rng(0)
Q, K, V = (jnp.asarray(_RNG.normal(size=s), jnp.float32)
           for s in ((B, H, T, D), (B, G, T, D), (B, G, T, D)))
POS = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
DOC = jnp.asarray([[0] * 100 + [1] * 140, [0] * 200 + [1] * 40], jnp.int32)  # two documents
VALID = jnp.asarray([[True] * T, [True] * 210 + [False] * 30])  # padded tail in row 1
COTANGENT = jnp.asarray(_RNG.normal(size=(B, H, T, D)), jnp.float32)


def _dape_params(features):
  return dape_cases.dape_params(_RNG, features, N, H)


def _case(kind):
  """(TileBias, raw bias parameters, raw -> kernel params [H, P], raw -> bias_fn)."""
  return dape_cases.bias_case(_RNG, kind, H)


def _losses(kind, features, causal=True, batch_axes=None):
  tile_bias, raw, kernel_params, bias_fn = _case(kind)
  mask = attention.AttentionMask(q_pos=POS, k_pos=POS, k_valid=VALID, q_document=DOC,
                                 k_document=DOC, causal=causal)

  def pallas_loss(q, k, v, dp, r):
    out = dape_attention.pallas_dape_attention(q, k, v, mask=mask, dape_params=dp,
                                               tile_bias=tile_bias,
                                               bias_params_HxP=kernel_params(r),
                                               batch_axes=batch_axes)
    return jnp.sum(out * COTANGENT), out

  def dense_loss(q, k, v, dp, r):
    transform = lambda s, b, *_: dape.dape_v1_transform(s, b, dp)
    out = attention.dense_attention(q, k, v, mask=mask, bias_fn=bias_fn(r),
                                    transform_fn=transform)
    return jnp.sum(out * COTANGENT), out

  return pallas_loss, dense_loss, (Q, K, V, _dape_params(features), raw)


@pytest.mark.parametrize('kind,features', [('kerple', 2 * H), ('alibi', 2 * H), ('kerple', H)])
def test_values_and_gradients_equal_dense(kind, features):
  """features 2H: the MLP reads scores and bias (DAPE's default); H: the scores only, and the
  kernels run per shard of a (one-device) mesh, as under the training step's mesh."""
  on_mesh = features == H
  pallas_loss, dense_loss, args = _losses(kind, features, batch_axes='data' if on_mesh else None)
  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4), has_aux=True))
  mesh = jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  with jax.set_mesh(mesh) if on_mesh else contextlib.nullcontext():
    (_, got), g_got = grad(pallas_loss)(*args)
  (_, want), g_want = grad(dense_loss)(*args)
  chex.assert_shape(got, (B, H, T, D))
  chex.assert_trees_all_equal_shapes_and_dtypes(g_got, g_want)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  assert float(jnp.max(jnp.abs(got[1, :, 210:]))) > 0  # padded keys: real queries still attend
  dape_cases.assert_gradients_equal(kind, g_got, g_want)
  if kind == 'kerple':  # p[0] is below the clamp: the gradient passes straight through
    assert float(jnp.abs(g_got[4]['p'][0])) > 0


def test_dape_v2_and_other_biases_are_refused_in_one_line():
  mask = attention.AttentionMask.causal_from_positions(POS)
  v2 = dict(w_in=jnp.zeros((3, 2 * H, N)), b_in=jnp.zeros(N), w_out=jnp.zeros((3, N, H)),
            b_out=jnp.zeros(H))
  with pytest.raises(ValueError, match=rf'fuses DAPE V1 only: w_in \(3, {2 * H}, {N}\) is V2') as e:
    dape_attention.pallas_dape_attention(Q, K, V, mask=mask, dape_params=v2,
                                         bias_params_HxP=jnp.ones((H, 2)))
  assert '\n' not in str(e.value)
  with pytest.raises(ValueError, match="bias 'fox' is not one of"):
    dape_attention.pallas_dape_attention(Q, K, V, mask=mask, dape_params=_dape_params(2 * H),
                                         tile_bias=TileBias('fox'))
  with pytest.raises(ValueError, match=f'needs C = 2H = {2 * H}'):
    dape_attention.pallas_dape_attention(Q, K, V, mask=mask, dape_params=_dape_params(3),
                                         bias_params_HxP=jnp.ones((H, 2)))


def test_flat_params_round_trip():
  flat = dape_tile.FlatParams(2 * H, N, H, 2)
  params, bias = _dape_params(2 * H), jnp.arange(2.0 * H).reshape(H, 2)
  got, got_bias = flat.unpack(flat.pack(params, bias))
  chex.assert_trees_all_equal(got, params)
  chex.assert_trees_all_equal(got_bias, bias)
  assert flat.size == 2 * H * N + N + N * H + H + 2 * H


def _copies(spec, grid, lo, hi) -> int:
  """How often the pipeline copies `spec`'s block over `grid`: once per change of its index."""
  last, count = None, 0
  for idx in np.ndindex(*grid):
    block = tuple(int(x) for x in spec.index_map(*idx, lo, hi))
    count, last = count + (block != last), block
  return count


def test_a_masked_tile_is_not_fetched():
  """Causal with two documents (the second from token 256): a step outside its row's range of
  key tiles repeats the block index of a neighbouring step that computes, so the pipeline,
  which copies a block only when its index changes, never fetches a masked tile."""
  b, t, block = 1, 512, 128
  n = t // block
  pos = jnp.arange(t, dtype=jnp.int32)[None]
  doc = (pos >= 256).astype(jnp.int32)
  q_info = layout.query_rows(pos, pos, doc, t)
  k_info = layout.key_info(pos, pos, doc, None, t)
  ranges = tile_ranges.tile_ranges(q_info, k_info, block, block, True)
  specs = dape_forward.specs(b, H, G, D, n, n, block, block, key_outer=False)
  lo, hi = np.asarray(ranges.k_lo), np.asarray(ranges.k_hi)
  assert (lo.tolist(), hi.tolist()) == ([0, 0, 2, 2], [0, 1, 2, 3])  # documents 0-255, 256-
  fetched, last = [], None
  for _, i, j in np.ndindex(b, n, n):
    index = tuple(int(x) for x in specs['k'].index_map(0, i, j, lo, hi))
    if index != last:
      fetched.append((i, index[-1]))
    last = index
  # each copied key block is one its query tile computes: (0, 0), (1, 1), (2, 2), (3, 3); the
  # blocks (1, 0) and (3, 2) are already loaded, the 10 masked tiles never copied
  assert fetched == [(0, 0), (1, 1), (2, 2), (3, 3)]
  assert _copies(specs['k'], (b, n, n), lo, hi) == 4


def _bytes(spec, grid, lo, hi, itemsize) -> int:
  shape = [s for s in spec.block_shape if s is not None]
  return _copies(spec, grid, lo, hi) * pallas_cost.tiled_bytes(shape, itemsize)


def test_cost_estimates_count_the_computed_tiles_and_the_blocks_the_specs_copy():
  b, t, block, d = 2, 512, 128, 8
  flat = dape_tile.FlatParams(2 * H, N, H, 2)
  n = t // block
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  q_info = layout.query_rows(pos, pos, None, t)
  k_info = layout.key_info(pos, pos, None, None, t)
  ranges = tile_ranges.tile_ranges(q_info, k_info, block, block, True)
  k_lo, k_hi, q_lo, q_hi = (np.asarray(x) for x in
                            (ranges.k_lo, ranges.k_hi, ranges.q_lo, ranges.q_hi))
  fixed = flat.size * 4 + 2 * k_lo.size * 4  # SMEM parameters, scalar-prefetch ranges
  fwd_est = dape_cost.forward_cost(b, H, G, t, t, d, block, block, True, 4, flat, k_lo.size,
                                   'alibi')
  dq_est, dkv_est = dape_cost.backward_cost(b, H, G, t, t, d, block, block, True, 4, flat,
                                            k_lo.size, 'alibi')
  tiles = b * sum(i + 1 for i in range(n))  # causal: the tiles on and below the diagonal
  mlp = 2 * H * N + N * H
  pairs = tiles * block * block
  assert fwd_est.flops == pairs * (4 * H * d + 2 * mlp)
  assert dq_est.flops == pairs * (6 * H * d + 6 * mlp)
  assert dkv_est.flops == pairs * (8 * H * d + 4 * mlp)
  assert fwd_est.transcendentals == pairs * H + b * H * t

  grid = (b, n, n)
  s = dape_forward.specs(b, H, G, d, n, n, block, block, key_outer=False)
  sizes = dict(q=4, k=4, v=4, do=4, lse=4, delta=4, q_info=4, k_info=4)
  copied = lambda names: sum(_bytes(s[x], grid, k_lo, k_hi, sizes[x]) for x in names)
  # forward: q, k, v, the side arrays in; out (q's blocks), lse out
  assert fwd_est.bytes_accessed == copied(['q', 'k', 'v', 'q_info', 'k_info', 'q', 'lse']) \
      + fixed
  assert dq_est.bytes_accessed == copied(
      ['q', 'k', 'v', 'do', 'lse', 'delta', 'q_info', 'k_info', 'q']) + fixed \
      + b * pallas_cost.tiled_bytes((N + 1, flat.grad_rows, block), 4)
  s = dape_forward.specs(b, H, G, d, n, n, block, block, key_outer=True)
  copied = lambda names: sum(_bytes(s[x], grid, q_lo, q_hi, sizes[x]) for x in names)
  assert dkv_est.bytes_accessed == copied(
      ['q', 'k', 'v', 'do', 'lse', 'delta', 'q_info', 'k_info', 'k', 'v']) + fixed


def test_the_tpu_lowering_is_mosaic():
  _, raw, kernel_params, _ = _case('kerple')
  mask = attention.AttentionMask(q_pos=POS, k_pos=POS, q_document=DOC, k_document=DOC)

  def loss(q, k, v, dp):
    out = dape_attention.pallas_dape_attention(q, k, v, mask=mask, dape_params=dp,
                                               bias_params_HxP=kernel_params(raw))
    return jnp.sum(out ** 2)

  shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (Q, K, V)]
  dp = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _dape_params(2 * H))
  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
  tpu = jax.export.export(grad, platforms=['tpu'])(*shapes, dp).mlir_module()
  assert tpu.count('tpu_custom_call') == 3  # forward, dQ with the parameters, dK / dV


@pytest.mark.slow  # a libtpu compile of the three kernels
def test_the_kernels_compile_for_a_v5e_chip_with_their_cost_estimates():
  pytest.importorskip('libtpu', reason='the TPU compiler (requirements-tpu.txt) is not installed')
  from bipe_jax.compile import topologies  # pylint: disable=import-outside-toplevel
  device = topologies.topology_devices('v5e:2x2')[0]
  b, t, d = 1, 256, 64
  on_chip = lambda shape, dtype: jax.ShapeDtypeStruct(
      shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
  flat = dape_tile.FlatParams(2 * H, N, H, 2)

  def loss(q, k, v, dp, bias_params):
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out = dape_attention.pallas_dape_attention(
        q, k, v, mask=attention.AttentionMask.causal_from_positions(pos), dape_params=dp,
        bias_params_HxP=bias_params)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  args = (on_chip((b, H, t, d), jnp.bfloat16), on_chip((b, G, t, d), jnp.bfloat16),
          on_chip((b, G, t, d), jnp.bfloat16),
          jax.tree.map(lambda x: on_chip(x.shape, x.dtype), _dape_params(2 * H)),
          on_chip((H, 2), jnp.float32))
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))).lower(*args).compile()
  assert compiled.as_text().count('tpu_custom_call') == 3
  shape = (b, H, G, t, t, d, 128, 128, True, 2, flat, b * t // 128, 'kerple')
  kernels = dape_cost.forward_cost(*shape).flops + sum(
      c.flops for c in dape_cost.backward_cost(*shape))
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, list) else analysis
  assert kernels <= analysis['flops'] < 1.1 * kernels  # XLA counts the kernels by the estimates
