"""The Pallas kernels (interpret mode on CPU) equal dense attention with the project's bias
functions, in values and in gradients (q, k, v and the bias parameters), for every covered bias
kind with causal + document masking, GQA and ragged lengths; the TPU (Mosaic) lowering exports;
attention_impl='pallas' in the model equals 'dense' (the
same parameters, Kerple's clamp and T5's table included)."""

import functools

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bipe_jax import attention
from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax.attention import pallas
from bipe_jax.encodings import alibi
from bipe_jax.encodings import kerple
from bipe_jax.encodings import t5
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import train_state

B, H, G, T, D = 2, 4, 2, 21, 8  # T: not a multiple of the 8-row tiles
BUCKETS, MAX_DISTANCE = 8, 16
_RNG = np.random.default_rng(0)
Q, K, V = (jnp.asarray(_RNG.normal(size=s), jnp.float32)
           for s in ((B, H, T, D), (B, G, T, D), (B, G, T, D)))
POS = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
INTER = jnp.asarray(np.cumsum(_RNG.random((B, T)) < 0.3, axis=1), jnp.int32)  # segment ids
DOC = jnp.asarray([[0] * 9 + [1] * 12, [0] * 15 + [1] * 6], jnp.int32)
VALID = jnp.asarray([[True] * 19 + [False] * 2, [True] * 21])  # right padding in row 0


def _bias_case(kind):
  """(TileBias, params [H, P], the project's bias_fn of those params)."""
  if kind == 'none':
    return pallas.TileBias('none'), None, lambda params: None
  if kind == 'alibi':  # BiPE-ALiBi's x96
    slopes = alibi.alibi_slopes(H)
    return (pallas.TileBias('alibi'), jnp.asarray(96.0 * slopes)[:, None],
            lambda params: functools.partial(alibi.alibi_bias, slopes_H=slopes, slope_factor=96.))
  if kind == 'kerple':
    params = jnp.asarray(_RNG.uniform(0.01, 2.0, (H, 2)), jnp.float32)
    return (pallas.TileBias('kerple'), params,
            lambda p: lambda qs, ks: kerple.kerple_log_bias(qs, ks, p[:, 0], p[:, 1]))
  table = jnp.asarray(_RNG.normal(size=(H, BUCKETS)), jnp.float32)
  return (pallas.TileBias('t5', t5_buckets=BUCKETS, t5_max_distance=MAX_DISTANCE), table,
          lambda p: lambda qs, ks: t5.t5_bias(qs, ks, p.T, BUCKETS, MAX_DISTANCE))


def _both(kind, stream, causal=True, documents=True):
  """Losses (pallas, dense) of (q, k, v, params), each returning (loss, output)."""
  tile_bias, params, make_bias_fn = _bias_case(kind)
  docs = dict(q_document=DOC, k_document=DOC) if documents else {}
  mask = attention.AttentionMask(q_pos=POS, k_pos=POS, k_valid=VALID, causal=causal, **docs)

  def weigh(o):  # a loss that reaches every output element differently
    return jnp.sum(o * jnp.cos(o) * jnp.arange(1, D + 1)), o

  def pallas_loss(q, k, v, p):
    return weigh(pallas.pallas_attention(
        q, k, v, mask=mask, q_streams=stream, k_streams=stream, tile_bias=tile_bias,
        bias_params_HxP=p, block_q=8, block_k=8))

  def dense_loss(q, k, v, p):
    return weigh(attention.dense_attention(
        q, k, v, mask=mask, q_streams=stream, k_streams=stream, bias_fn=make_bias_fn(p)))

  return pallas_loss, dense_loss, params


def _check(kind, stream, **kw):
  pallas_loss, dense_loss, params = _both(kind, stream, **kw)
  argnums = (0, 1, 2) if params is None else (0, 1, 2, 3)
  grad = lambda f: jax.jit(jax.value_and_grad(f, argnums=argnums, has_aux=True))(Q, K, V, params)
  (_, got), g_got = grad(pallas_loss)
  (_, want), g_want = grad(dense_loss)
  real = np.asarray(VALID)[:, None, :, None]  # a padding query's row is not defined
  chex.assert_shape(got, (B, H, T, D))
  np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=2e-6)
  chex.assert_trees_all_close(g_got, g_want, atol=2e-5, rtol=1e-5)
  return g_got


@pytest.mark.parametrize('kind,stream', [('alibi', INTER), ('kerple', INTER), ('t5', POS),
                                         ('none', POS)],
                         ids=['bipe_alibi', 'bipe_kerple', 't5', 'none'])
def test_values_and_gradients_equal_dense_attention(kind, stream):
  grads = _check(kind, stream)
  if kind in ('kerple', 't5'):  # the learned parameters get a real gradient
    assert float(jnp.abs(grads[3]).min()) > 0.0


def test_without_causality_or_documents_and_under_jit():
  pallas_loss, dense_loss, params = _both('kerple', POS, causal=False, documents=False)
  got = jax.jit(jax.grad(lambda *a: pallas_loss(*a)[0], argnums=(0, 3)))(Q, K, V, params)
  want = jax.grad(lambda *a: dense_loss(*a)[0], argnums=(0, 3))(Q, K, V, params)  # no jit
  chex.assert_trees_all_close(got, want, atol=2e-5, rtol=1e-5)


def test_a_query_that_sees_no_key_gets_zeros_and_finite_gradients():
  valid = jnp.zeros((B, T), bool).at[:, 5:].set(True)  # rows 0..4 see nothing (causal)
  mask = attention.AttentionMask(q_pos=POS, k_pos=POS, k_valid=valid)
  f = lambda q: pallas.pallas_attention(q, K, V, mask=mask, block_q=8, block_k=8)
  out = jax.jit(f)(Q)
  np.testing.assert_array_equal(np.asarray(out[:, :, :5]), 0.0)
  assert np.isfinite(np.asarray(jax.jit(jax.grad(lambda q: jnp.sum(f(q))))(Q))).all()


def test_bad_parameters_are_one_clear_error():
  mask = attention.AttentionMask.causal_from_positions(POS)
  with pytest.raises(ValueError, match=r"bias 'kerple' needs params \[H, P\]=\(4, 2\)"):
    pallas.pallas_attention(Q, K, V, mask=mask, tile_bias=pallas.TileBias('kerple'),
                            bias_params_HxP=jnp.zeros((4, 1)))
  with pytest.raises(ValueError, match="bias kind 'fire' is not one of"):
    pallas.TileBias('fire')
  with pytest.raises(ValueError, match="attention_impl='pallas' takes the bias as tile_bias"):
    attention.attention_fn('pallas')(Q, K, V, mask=mask, bias_fn=lambda q, k: 0.0)


def test_the_tpu_lowering_is_mosaic_and_the_cpu_lowering_interprets():
  tile_bias, params, _ = _bias_case('t5')
  shapes = [jax.ShapeDtypeStruct(x.shape, jnp.bfloat16) for x in (Q, K, V)]

  def step(q, k, v):
    mask = attention.AttentionMask(q_pos=POS, k_pos=POS, q_document=DOC, k_document=DOC)
    out = pallas.pallas_attention(q, k, v, mask=mask, tile_bias=tile_bias, bias_params_HxP=params)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  grad = jax.jit(jax.grad(step, argnums=(0, 1, 2)))
  tpu = jax.export.export(grad, platforms=['tpu'])(*shapes).mlir_module()
  assert tpu.count('tpu_custom_call') == 3  # forward, dQ, dK / dV
  cpu = jax.export.export(grad, platforms=['cpu'])(*shapes).mlir_module()
  assert 'tpu_custom_call' not in cpu


def _model(name, impl, **extra):
  fields = dict(vocab_size=16, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                ffn_size=64, position_encoding=name, separators='ids', separator_ids=(3, 4),
                max_intra=64, max_position=64, block_size=8, attention_impl=impl, bos_id=1,
                t5_buckets=8, t5_max_distance=16, train_length=32)
  fields.update(extra)
  return model_lib.Transformer(config_lib.model_config_from_dict(fields))


TOKENS = jnp.asarray(np.random.default_rng(1).integers(0, 16, (2, 20)), jnp.int32)


@pytest.mark.parametrize('name,extra', [
    ('bipe_alibi', {'restart_at_documents': True, 'mask_across_documents': True}),
    ('kerple', {}),
    ('t5', {'pad_id': 0}),
    ('rope', {}),
    ('bipe_fox', {'pad_id': 0}),  # FoX's float positions, their gradient from the kernel
    # DAPE V1 fused (pallas/dape_attention.py): Kerple on the segment index, documents, padding
    ('bipe_dape_kerple', {'pad_id': 0, 'mask_across_documents': True}),
])
def test_model_with_pallas_equals_dense(name, extra):
  dense, kernel = _model(name, 'dense', **extra), _model(name, 'pallas', **extra)
  params = dense.init(jax.random.PRNGKey(0), TOKENS)['params']
  chex.assert_trees_all_equal_shapes(kernel.init(jax.random.PRNGKey(0), TOKENS)['params'],
                                     params)
  real = TOKENS != extra.get('pad_id', -1)

  def loss(model, p):
    logits = model.apply({'params': p}, TOKENS)
    return jnp.mean(jax.nn.log_softmax(logits).max(-1) * real * jnp.arange(20.0))

  assert_kernel_model_equals_dense(dense, kernel, loss, params)


def assert_kernel_model_equals_dense(dense, kernel, loss, params):
  """loss(model, params) and its gradients: the kernel model's, under the training mesh (one
  device here: the kernels run inside a shard_map), equal the dense model's."""
  want, g_want = jax.jit(jax.value_and_grad(lambda p: loss(dense, p)))(params)
  mesh = mesh_lib.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1)))
  with train_state.mesh_context(mesh):
    got, g_got = jax.jit(jax.value_and_grad(lambda p: loss(kernel, p)))(params)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  chex.assert_trees_all_close(g_got, g_want, rtol=1e-4, atol=1e-6)


def test_config_refuses_the_encodings_the_kernel_does_not_cover():
  for name in ('fire', 'dapev2_kerple', 'dape_fire'):
    with pytest.raises(ValueError, match="attention_impl.*compute only the ALiBi, Kerple, T5"):
      _model(name, 'pallas')


# ------------------------------------------------ the tiles computed and fetched (tile_ranges.py)

def _brute_needed(q_pos, k_pos, valid, q_doc, k_doc, bq, bk):
  """bool [B, n_q, n_k] by loops: does tile (i, j) hold a visible pair?"""
  b, tq = q_pos.shape
  tk = k_pos.shape[1]
  out = np.zeros((b, tq // bq, tk // bk), bool)
  for r in range(b):
    for x in range(tq):
      for y in range(tk):
        if valid[r, y] and q_doc[r, x] == k_doc[r, y] and k_pos[r, y] <= q_pos[r, x]:
          out[r, x // bq, y // bk] = True
  return out


def _side_info(q_pos, k_pos, valid, q_doc, k_doc, tq, tk):
  from bipe_jax.attention.pallas import layout  # pylint: disable=g-import-not-at-top
  return (layout.query_rows(q_pos, q_pos, q_doc, tq),
          layout.key_info(k_pos, k_pos, k_doc, valid, tk))


# two rows of 48 tokens in tiles of 8: documents start at 13 / 30 (row 0) and 20 (row 1); row 1
# ends in 14 padding keys, so its last key tile holds no valid key
RT = 48
R_POS = np.broadcast_to(np.arange(RT), (2, RT))
R_DOC = np.stack([np.searchsorted([13, 30], np.arange(RT), side='right'),
                  np.searchsorted([20], np.arange(RT), side='right')])
R_VALID = np.stack([np.ones(RT, bool), np.arange(RT) < RT - 14])


def test_tile_ranges_are_the_tiles_with_a_visible_pair():
  from bipe_jax.attention.pallas import tile_ranges  # pylint: disable=g-import-not-at-top
  q_info, k_info = _side_info(*map(jnp.asarray, (R_POS, R_POS, R_VALID, R_DOC, R_DOC)), RT, RT)
  for bq, bk in ((8, 8), (8, 16), (16, 8)):
    want = _brute_needed(R_POS, R_POS, R_VALID, R_DOC, R_DOC, bq, bk)
    got = np.asarray(tile_ranges.needed_tiles(q_info, k_info, bq, bk, True))[:, 0]
    np.testing.assert_array_equal(got, want)  # packed documents: exact
    r = tile_ranges.tile_ranges(q_info, k_info, bq, bk, True)
    for lo, hi, needed in ((r.k_lo, r.k_hi, want), (r.q_lo, r.q_hi, want.swapaxes(1, 2))):
      lo, hi = np.asarray(lo).reshape(needed.shape[:2]), np.asarray(hi).reshape(needed.shape[:2])
      for row, col in np.ndindex(*needed.shape[:2]):
        cols = np.flatnonzero(needed[row, col])
        if cols.size:
          assert (lo[row, col], hi[row, col]) == (cols[0], cols[-1])
        else:  # nothing needed (the padding key tile): an empty range ending on the last
          assert (lo[row, col], hi[row, col]) == (hi[row, col - 1] + 1, hi[row, col - 1])
  want = _brute_needed(R_POS, R_POS, R_VALID, R_DOC, R_DOC, 8, 8)
  assert not want[1, :, -1].any() and not want[0, 5, 0]  # padding; another document


def test_a_masked_tile_repeats_a_loaded_block_index():
  """The index maps of the forward, dQ and dK / dV calls, evaluated over their grids with the
  ranges of documents + padding: a step outside its row's range asks for the block the step
  before it asked for (or, before the range, the range's first block), so the pipeline copies
  only the blocks of needed tiles, each once per row."""
  from bipe_jax.attention.pallas import backward as bwd  # pylint: disable=g-import-not-at-top
  from bipe_jax.attention.pallas import forward as fwd  # pylint: disable=g-import-not-at-top
  from bipe_jax.attention.pallas import tile_ranges  # pylint: disable=g-import-not-at-top
  bq = bk = 8
  n = RT // bq
  q_info, k_info = _side_info(*map(jnp.asarray, (R_POS, R_POS, R_VALID, R_DOC, R_DOC)), RT, RT)
  r = tile_ranges.tile_ranges(q_info, k_info, bq, bk, True)
  needed = _brute_needed(R_POS, R_POS, R_VALID, R_DOC, R_DOC, bq, bk)
  shape = (2, 2, 1, 8, n, n, bq, bk, 1, False)
  rows = fwd.Rows(n, 2, False)
  calls = [(fwd.forward_specs(*shape, rows), (r.k_lo, r.k_hi), 3, needed, 1),  # k spec
           (bwd.dq_specs(*shape, rows), (r.k_lo, r.k_hi), 3, needed, 1),
           (bwd.dkv_specs(*shape, rows), (r.q_lo, r.q_hi), 4, needed.swapaxes(1, 2), 0)]
  for (grid, in_specs, _), (lo, hi), inner, need, spec in calls:
    lo, hi = np.asarray(lo), np.asarray(hi)  # blocks: forward / dQ: of k; dK / dV: of q
    last = None
    every = _block_indices(in_specs[spec], grid, (lo, hi))[:, -1].reshape(grid)
    for outer in np.ndindex(*grid[:inner]):
      blocks = list(every[outer])
      wanted = np.flatnonzero(need[outer[0], outer[2]])
      if not wanted.size:  # a row that needs nothing (padding) keeps the last block loaded
        assert set(blocks) == {last}
        continue
      assert sorted(set(blocks)) == list(wanted)  # no block of a masked tile is fetched
      for step in range(grid[inner]):
        if step not in wanted:  # a masked step repeats its neighbour's block
          assert blocks[step] == (blocks[step - 1] if step > wanted[0] else wanted[0])
      last = blocks[-1]


def _tiled(shape, itemsize):
  """Bytes of a block in TPU memory: the last two axes padded to (32 / (8 * itemsize) * 8, 128)
  tiles (int32 / float32: 8 x 128, bfloat16: 16 x 128)."""
  *lead, s, l = shape
  sub = 8 * (4 // itemsize)
  return int(np.prod(lead, dtype=int)) * (-(-s // sub) * sub) * (-(-l // 128) * 128) * itemsize


def _block_indices(spec, grid, prefetch):
  """int [steps, ndim]: the block index `spec` asks for at every step of `grid`, in order."""
  steps = np.indices(grid).reshape(len(grid), -1)
  prefetch = tuple(jnp.asarray(x) for x in prefetch)
  index = jax.vmap(lambda *a: spec.index_map(*a, *prefetch))(*map(jnp.asarray, steps))
  return np.stack([np.broadcast_to(np.asarray(x), steps.shape[1:]) for x in index], axis=1)


def _copies(grid, specs, itemsizes, prefetch):
  """Bytes a pipeline copies: per spec, the grid steps whose block index differs from the step
  before (the first step included), times the block's bytes."""
  total = 0
  for spec, size in zip(specs, itemsizes):
    index = _block_indices(spec, grid, prefetch)
    count = 1 + int(np.sum(np.any(index[1:] != index[:-1], axis=1)))
    total += count * _tiled([s for s in spec.block_shape if s is not None], size)
  return total


@pytest.mark.parametrize('h,g,bq,bk', [(2, 1, 16, 16), (2, 2, 16, 32), (1, 1, 32, 16)])
def test_cost_estimate_bytes_equal_the_copies_of_the_grid(h, g, bq, bk):
  """pallas/cost.py's bytes against the copies counted over each call's grid from its block
  specs, with the ranges of the training case (causal, no documents or padding), bfloat16
  q / k / v, FoX's float positions and T5's 8 parameters."""
  from bipe_jax.attention.pallas import backward as bwd  # pylint: disable=g-import-not-at-top
  from bipe_jax.attention.pallas import cost  # pylint: disable=g-import-not-at-top
  from bipe_jax.attention.pallas import forward as fwd  # pylint: disable=g-import-not-at-top
  from bipe_jax.attention.pallas import tile_ranges  # pylint: disable=g-import-not-at-top
  b, t, d, p, x = 2, 64, 16, 8, 2  # x: bfloat16's itemsize
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  q_info, k_info = _side_info(pos, pos, None, None, None, t, t)
  r = tile_ranges.tile_ranges(q_info, k_info, bq, bk, True)
  shape = (b, h, g, d, t // bq, t // bk, bq, bk, p, True)
  fwd_in, fwd_out = [x, x, x, 4, 4, 4, 4, 4], [x, 4]  # q k v q_info k_info params c_q c_k
  bwd_in = [x, x, x, x, 4, 4, 4, 4, 4, 4, 4]  # q k v dO lse delta q_info k_info params c_q c_k
  k_range, q_range = (r.k_lo, r.k_hi), (r.q_lo, r.q_hi)
  ranges = 2 * r.k_lo.size * 4
  want = []
  for (grid, ins, outs), sizes, prefetch in (
      (fwd.forward_specs(*shape, fwd.Rows(t // bq, h, False)), (fwd_in, fwd_out), k_range),
      (bwd.dq_specs(*shape, fwd.Rows(t // bq, h, False)), (bwd_in, [x, 4, 4]), k_range),
      (bwd.dkv_specs(*shape, fwd.Rows(t // bk, h, False)), (bwd_in, [x, x, 4]), q_range)):
    prefetch = tuple(np.asarray(a) for a in prefetch)
    want.append(_copies(grid, ins, sizes[0], prefetch) + _copies(grid, outs, sizes[1], prefetch)
                + ranges)
  got = [cost.forward_cost(b, h, g, t, t, d, bq, bk, True, x, p, True, r.k_lo.size),
         *cost.backward_cost(b, h, g, t, t, d, bq, bk, True, x, p, True, r.k_lo.size)]
  assert [e.bytes_accessed for e in got] == want


def _fox_case():
  """FoX with fast forgetting over R_* (documents, padding): q [2, 2, 48, 8], k / v
  [2, 1, 48, 8], c [2, 48, 2]; the mask."""
  rng = np.random.default_rng(3)
  q = jnp.asarray(0.3 * rng.normal(size=(2, 2, RT, 8)), jnp.float32)  # small scores: a high
  k, v = (jnp.asarray(rng.normal(size=(2, 1, RT, 8)) * f, jnp.float32) for f in (0.3, 1.0))
  c = jnp.asarray(np.cumsum(-rng.uniform(1.0, 2.0, (2, RT, 2)), axis=1), jnp.float32)  # bound
  mask = attention.AttentionMask(q_pos=jnp.asarray(R_POS), k_pos=jnp.asarray(R_POS),
                                 k_valid=jnp.asarray(R_VALID), q_document=jnp.asarray(R_DOC),
                                 k_document=jnp.asarray(R_DOC))
  return q, k, v, c, mask


def _pruned_by_hand(q, k, c, tolerance):
  """bool [B, H, n_q, n_k] by loops: max c_q over the query tile - min c_k over its valid keys
  below FoX's threshold (encodings/fox.py), tiles of 8."""
  from bipe_jax.encodings import fox  # pylint: disable=g-import-not-at-top
  threshold = float(fox.pruning_threshold(q, k, RT, tolerance))
  c = np.asarray(c)
  n = RT // 8
  out = np.zeros((2, 2, n, n), bool)
  for b, h, i, j in np.ndindex(*out.shape):
    keys = [y for y in range(8 * j, 8 * j + 8) if R_VALID[b, y]]
    if keys:
      out[b, h, i, j] = c[b, 8 * i:8 * i + 8, h].max() - c[b, keys, h].min() < threshold
  return out


def test_fox_pruning_with_documents_and_padding_equals_dense_without_the_pruned_tiles():
  """Values and gradients (q, k, v, c) of the kernels with FoX's pruning equal a plain dense
  softmax over the visible pairs outside the pruned tiles (per row, head and tile); with NaN
  values in a pruned key tile, the rows that prune it stay finite in the forward and dQ."""
  q, k, v, c, mask = _fox_case()
  tolerance = -2.0  # high, so that tiles one apart are pruned too
  pruned = _pruned_by_hand(q, k, c, tolerance)
  visible = _brute_needed(R_POS, R_POS, R_VALID, R_DOC, R_DOC, 8, 8)[:, None]
  assert (pruned & visible).sum() >= 4  # the pruning skips tiles the masks would compute
  x = np.arange(RT)
  keep = ((x[None, :] <= x[:, None])[None, None] & R_VALID[:, None, None, :]
          & (R_DOC[:, None, :, None] == R_DOC[:, None, None, :])
          & ~np.repeat(np.repeat(pruned, 8, axis=2), 8, axis=3))

  def reference(q, k, v, c):
    s = jnp.einsum('bhxd,bgyd->bhxy', q, k) / np.sqrt(8.0)
    s = s + jnp.moveaxis(c, 2, 1)[:, :, :, None] - jnp.moveaxis(c, 2, 1)[:, :, None, :]
    s = jnp.where(keep, s, -1e30)
    p = jnp.exp(s - s.max(-1, keepdims=True)) * keep
    total = p.sum(-1, keepdims=True)  # 0: a row whose keys are all pruned or masked gets zeros
    return jnp.einsum('bhxy,bgyd->bhxd', p / jnp.where(total > 0, total, 1.0), v)

  def kernel(q, k, v, c):
    return pallas.pallas_attention(q, k, v, mask=mask, q_streams=c, k_streams=c,
                                   tile_bias=pallas.TileBias('fox'), block_q=8, block_k=8,
                                   fox_log_pruning_tolerance=tolerance)

  weight = jnp.asarray(np.random.default_rng(4).normal(size=(2, 2, RT, 8)), jnp.float32)
  loss = lambda f: lambda *a: jnp.sum(f(*a) * weight)
  got, want = (jax.jit(jax.value_and_grad(loss(f), argnums=(0, 1, 2, 3)))(q, k, v, c)
               for f in (kernel, reference))
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  chex.assert_trees_all_close(got[1], want[1], atol=2e-5, rtol=1e-4)

  # a visible tile (i, j) of row b, head h that is pruned: NaN values in key tile j are never
  # read for query tile i (in the forward and dQ), though the diagonal tile (j, j) reads them
  b, h, i, j = np.argwhere(pruned & visible)[0]
  out, vjp = jax.vjp(kernel, q, k, v.at[b, :, 8 * j:8 * j + 8].set(jnp.nan), c)
  rows = np.arange(8 * i, 8 * i + 8)
  assert np.isfinite(np.asarray(out[b, h, rows])).all()
  assert np.isnan(np.asarray(out[b, h, 8 * j:8 * j + 8])).all()
  dq = vjp(jnp.zeros_like(out).at[b, h, rows].set(1.0))[0]
  assert np.isfinite(np.asarray(dq[b, h, rows])).all()


def test_model_with_the_gpu_dape_kernel_equals_dense():
  """DAPE V1 fused into the Triton kernels (pallas/gpu_dape_attention.py, interpret mode here)
  through the whole model: Kerple on the segment index, documents, padding. The logits of
  every position; the kernels' gradients (q, k, v, DAPE's MLP, Kerple's p and a) are compared
  with dense DAPE in tests/attention/test_pallas_gpu_dape.py (the model's gradient here, in
  interpret mode, cost 25-35 s of the suite)."""
  extra = {'pad_id': 0, 'mask_across_documents': True}
  dense = _model('bipe_dape_kerple', 'dense', **extra)
  kernel = _model('bipe_dape_kerple', 'pallas_gpu', **extra)
  params = dense.init(jax.random.PRNGKey(0), TOKENS)['params']
  want = jax.jit(lambda p: dense.apply({'params': p}, TOKENS))(params)
  mesh = mesh_lib.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1)))
  with train_state.mesh_context(mesh):
    got = jax.jit(lambda p: kernel.apply({'params': p}, TOKENS))(params)
  real = np.asarray(TOKENS != 0)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], rtol=1e-5,
                             atol=1e-5)
