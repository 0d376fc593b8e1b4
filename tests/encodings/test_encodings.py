"""Positional encodings vs loop-based NumPy references and hand-computed values."""

import math

from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import encodings as E
from tests import reference_numpy as ref


def _positions(seed, shape, high):
  return np.random.default_rng(seed).integers(0, high, size=shape).astype(np.int32)


class AbsoluteTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_sinusoidal_hand_values(self):
    pos = jnp.array([[0, 1, 7]])
    out = self.variant(lambda p: E.sinusoidal_embedding(p, 6))(pos)
    chex.assert_shape(out, (1, 3, 6))
    freqs = [10000.0**(-i / 3) for i in range(3)]
    for t, p in enumerate([0, 1, 7]):
      expected = [math.sin(p * f) for f in freqs] + [math.cos(p * f) for f in freqs]
      np.testing.assert_allclose(out[0, t], expected, rtol=1e-5, atol=1e-6)
    odd = E.sinusoidal_embedding(pos, 5)
    chex.assert_shape(odd, (1, 3, 5))
    np.testing.assert_array_equal(odd[..., -1], 0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_learned_table_clamps_and_has_logical_axes(self):
    module = E.LearnedPositionEmbedding(num_positions=4, features=3)
    pos = jnp.array([[0, 3, 4, 100]])
    with jax.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))):  # names
      variables = module.init(jax.random.key(0), pos)
    boxed = variables['params']['embedding']
    assert boxed.names == ('positions', 'embed')
    table = np.asarray(boxed.unbox())
    assert 0.01 < table.std() < 0.04
    out = self.variant(module.apply)(variables, pos)
    chex.assert_shape(out, (1, 4, 3))
    np.testing.assert_array_equal(out[0], table[[0, 3, 3, 3]])
    quirk = E.LearnedPositionEmbedding(4, 3, zero_last_row=True)
    out = quirk.apply(variables, pos)
    np.testing.assert_array_equal(out[0, 1:], 0)
    grad = jax.grad(lambda v: quirk.apply(v, jnp.array([[3, 1]])).sum())(variables)
    np.testing.assert_array_equal(grad['params']['embedding'].unbox()[3], 0)
    np.testing.assert_array_equal(grad['params']['embedding'].unbox()[1], 1)


class RopeTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_loop_reference_with_arbitrary_positions(self):
    x = np.random.default_rng(0).normal(size=(2, 3, 5, 8)).astype(np.float32)
    pos = _positions(1, (2, 5), 3000)  # e.g. token ids or inter-segment ids, unsorted
    inv = E.rope_inv_frequencies(8)
    out = self.variant(E.apply_rope)(x, pos, inv, 1.3)
    chex.assert_shape(out, x.shape)
    np.testing.assert_allclose(out, ref.rope_ref(x, pos, inv, 1.3), rtol=2e-4, atol=2e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_scores_depend_only_on_position_difference(self):
    rng = np.random.default_rng(2)
    q = rng.normal(size=(1, 2, 6, 16)).astype(np.float32)
    k = rng.normal(size=(1, 2, 6, 16)).astype(np.float32)
    pos = jnp.arange(6)[None] * 3
    inv = E.rope_inv_frequencies(16)
    rope = self.variant(E.apply_rope)

    def scores(shift):
      rq, rk = rope(q, pos + shift, inv), rope(k, pos + shift, inv)
      return np.einsum('bhqd,bhkd->bhqk', rq, rk)
    base = scores(0)
    np.testing.assert_allclose(scores(37), base, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(scores(101), base, rtol=1e-4, atol=1e-4)
    assert not np.allclose(base, np.einsum('bhqd,bhkd->bhqk', q, k), atol=1e-2)

  @chex.variants(with_jit=True, without_jit=True)
  def test_bf16_in_bf16_out(self):
    x = jnp.ones((1, 2, 4, 8), jnp.bfloat16)
    out = self.variant(E.apply_rope)(x, jnp.arange(4)[None], E.rope_inv_frequencies(8))
    assert out.dtype == jnp.bfloat16
    chex.assert_shape(out, x.shape)
    full = E.apply_rope(x.astype(jnp.float32), jnp.arange(4)[None], E.rope_inv_frequencies(8))
    np.testing.assert_allclose(out.astype(np.float32), full, atol=1e-2)

  @chex.variants(with_jit=True, without_jit=True)
  def test_table_lookup_matches_loop_reference_and_computed_tables(self):
    from bipe_jax.encodings import rope as rope_lib  # pylint: disable=import-outside-toplevel
    x = np.random.default_rng(3).normal(size=(2, 3, 7, 8)).astype(np.float32)
    pos = _positions(4, (2, 7), 50)
    inv = E.rope_inv_frequencies(8, scaling='yarn', factor=2.0, original_length=16)
    from bipe_jax.kernels import cpu as cpu_kernels  # pylint: disable=import-outside-toplevel
    cos, sin = self.variant(lambda p: cpu_kernels.rope_cos_sin_lookup(p, inv, 50, 1.1))(pos)
    chex.assert_shape([cos, sin], (2, 1, 7, 8))
    computed = rope_lib.rope_cos_sin(pos, inv, 1.1)
    np.testing.assert_allclose(cos, computed[0], atol=2e-6)
    np.testing.assert_allclose(sin, computed[1], atol=2e-6)
    np.testing.assert_allclose(rope_lib.rotate(x, cos, sin), ref.rope_ref(x, pos, inv, 1.1),
                               rtol=2e-5, atol=2e-5)

  def test_table_lookup_rejects_a_range_it_cannot_hold(self):
    from bipe_jax.kernels import cpu as cpu_kernels  # pylint: disable=import-outside-toplevel
    inv = E.rope_inv_frequencies(8)
    for bad in (0, cpu_kernels.MAX_TABLE_POSITIONS + 1):
      with pytest.raises(ValueError, match='num_positions'):
        cpu_kernels.rope_cos_sin_lookup(jnp.zeros((1, 2), jnp.int32), inv, bad)

  def test_frequency_scalings_match_hand_formulas(self):
    dh, base, s = 16, 10000.0, 4.0
    plain = np.array([base**(-2 * i / dh) for i in range(dh // 2)])
    np.testing.assert_allclose(E.rope_inv_frequencies(dh, base), plain, rtol=1e-6)
    np.testing.assert_allclose(E.rope_inv_frequencies(dh, base, 'linear', s), plain / s,
                               rtol=1e-6)
    ntk_base = base * s**(dh / (dh - 2))
    np.testing.assert_allclose(E.rope_inv_frequencies(dh, base, 'ntk', s),
                               [ntk_base**(-2 * i / dh) for i in range(dh // 2)], rtol=1e-5)
    # YaRN, original length 64: correction dims d(r) = Dh ln(L / (2 pi r)) / (2 ln base).
    length = 64
    d = lambda r: dh * math.log(length / (2 * math.pi * r)) / (2 * math.log(base))
    low, high = max(math.floor(d(32)), 0), min(math.ceil(d(1)), dh - 1)
    assert (low, high) == (0, 3)  # d(32) < 0, d(1) = 2.02: ramp over dims 0..3
    yarn = E.rope_inv_frequencies(dh, base, 'yarn', s, original_length=length)
    ramp = np.array([0, 1 / 3, 2 / 3, 1, 1, 1, 1, 1])  # 0: keep theta, 1: theta / s
    expected = plain * (1 - ramp) + plain / s * ramp
    np.testing.assert_allclose(yarn, expected, rtol=1e-6)
    assert E.rope_attention_scale('yarn', s) == pytest.approx(0.1 * math.log(4) + 1)
    assert E.rope_attention_scale('linear', s) == 1.0
    np.testing.assert_allclose(E.rope_inv_frequencies(dh, base, 'yarn', 1.0), plain, rtol=1e-6)

  def test_log_scale_and_errors(self):
    out = E.rope_log_scale(jnp.array([[0, 1, 1023, 4095]]), 1024)
    chex.assert_shape(out, (1, 4))
    np.testing.assert_allclose(out[0], [0.0, math.log(2) / math.log(1024), 1.0, 1.2],
                               rtol=1e-5)
    np.testing.assert_allclose(E.rope_log_scale(jnp.array([[0, 4095]]), 1024, 1.0)[0],
                               [1.0, 1.2], rtol=1e-5)
    with pytest.raises(ValueError, match="'cubic'"):
      E.rope_inv_frequencies(8, scaling='cubic')
    with pytest.raises(ValueError, match='even'):
      E.rope_inv_frequencies(7)
    with pytest.raises(ValueError, match='factor'):
      E.rope_inv_frequencies(8, scaling='linear', factor=0.5)
    with pytest.raises(ValueError, match='inv_freq'):
      E.apply_rope(jnp.ones((1, 1, 2, 8)), jnp.zeros((1, 2), jnp.int32),
                   E.rope_inv_frequencies(6))


class BiasTest(chex.TestCase):

  def test_alibi_slopes_reference_lists(self):
    twelve = [2.0**-i for i in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    np.testing.assert_allclose(E.alibi_slopes(12), twelve, rtol=1e-7)
    np.testing.assert_allclose(E.alibi_slopes(8), [2.0**-i for i in range(1, 9)], rtol=1e-7)
    np.testing.assert_allclose(E.alibi_slopes(4), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])
    np.testing.assert_allclose(E.alibi_slopes(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8,
                                                   2.0**-1, 2.0**-3])
    with pytest.raises(ValueError, match='num_heads'):
      E.alibi_slopes(0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_alibi_and_bipe_alibi_hand_values(self):
    slopes = np.array([0.5, 0.25], np.float32)
    tok = jnp.array([[0, 1, 2]])
    out = self.variant(lambda q, k: E.alibi_bias(q, k, slopes))(tok, tok)
    chex.assert_shape(out, (1, 2, 3, 3))
    np.testing.assert_allclose(out[0, 0], [[0, 0, 0], [-0.5, 0, 0], [-1.0, -0.5, 0]])
    np.testing.assert_allclose(out[0, 1], [[0, 0, 0], [-0.25, 0, 0], [-0.5, -0.25, 0]])
    # BiPE-ALiBi: segment ids [0, 0, 1], slopes x 96; same segment -> 0.
    seg = jnp.array([[0, 0, 1]])
    out = self.variant(lambda q, k: E.alibi_bias(q, k, slopes, 96.))(seg, seg)
    np.testing.assert_allclose(out[0, 0], [[0, 0, 0], [0, 0, 0], [-48., -48., 0]])
    np.testing.assert_allclose(out[0, 1], [[0, 0, 0], [0, 0, 0], [-24., -24., 0]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_alibi_matches_loop_reference_per_block(self):
    q, k = _positions(3, (2, 4), 50), _positions(4, (2, 6), 50)
    slopes = E.alibi_slopes(3)
    out = self.variant(lambda q, k: E.alibi_bias(q, k, slopes, 2.0))(q, k)
    chex.assert_shape(out, (2, 3, 4, 6))
    np.testing.assert_allclose(out, ref.alibi_bias_ref(q, k, slopes, 2.0), rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_kerple_matches_loop_reference(self):
    q, k = _positions(5, (2, 5), 300), _positions(6, (1, 7), 300)
    module = E.KerpleLogBias(num_heads=3)
    variables = module.init(jax.random.key(1), q, k)
    p, a = variables['params']['p'], variables['params']['a']
    assert np.all((p >= 0) & (p <= 2)) and np.all((a >= 0) & (a <= 1))
    variables = {'params': {'p': jnp.array([0.001, 1.5, 0.3]), 'a': jnp.array([0.7, -1., 0.2])}}
    out = self.variant(module.apply)(variables, q, k)
    chex.assert_shape(out, (2, 3, 5, 7))
    expected = ref.kerple_log_bias_ref(q, k, [0.01, 1.5, 0.3], [0.7, 0.01, 0.2])  # clamped
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_fire_matches_loop_reference(self):
    q, k = _positions(7, (2, 4), 40), _positions(8, (2, 5), 40)
    module = E.FireBias(num_heads=2, hidden=4, init_L=16.)
    variables = module.init(jax.random.key(2), q, k)
    prm = dict(variables['params'])
    assert float(prm['c']) == pytest.approx(0.1) and float(prm['L_multiplier']) == 1.0
    prm['L_multiplier'] = jnp.array(-1.5)  # |L_mult * L0| = 24
    prm['c'] = jnp.array(0.3)
    out = self.variant(module.apply)({'params': prm}, q, k)
    chex.assert_shape(out, (2, 2, 4, 5))
    expected = ref.fire_bias_ref(q, k, c=0.3, l_multiplier=-1.5, init_L=16., w_in=prm['w_in'],
                                 b_in=prm['b_in'], w_out=prm['w_out'], b_out=prm['b_out'])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)

  def test_t5_buckets_match_loop_reference(self):
    distance = np.arange(-300, 301)
    for nb, md, bi in [(32, 128, False), (32, 128, True), (16, 64, False), (8, 20, False)]:
      got = np.asarray(E.t5_relative_bucket(jnp.asarray(distance), nb, md, bi))
      expected = [ref.t5_bucket_ref(int(d), nb, md, bi) for d in distance]
      np.testing.assert_array_equal(got, expected, err_msg=f'{nb} {md} {bi}')
    causal = np.asarray(E.t5_relative_bucket(jnp.array([0, 1, 15, 16, 31, 32, 127, 128, 10**6])))
    np.testing.assert_array_equal(causal, [0, 1, 15, 16, 21, 21, 31, 31, 31])
    assert int(E.t5_relative_bucket(jnp.array(-5))) == 0

  @chex.variants(with_jit=True, without_jit=True)
  def test_t5_bias_gathers_the_table(self):
    q, k = _positions(9, (2, 3), 200), _positions(10, (2, 4), 200)
    module = E.T5RelativeBias(num_heads=2, num_buckets=16, max_distance=64)
    variables = module.init(jax.random.key(3), q, k)
    table = np.asarray(variables['params']['rel_embedding'])
    chex.assert_shape(table, (16, 2))
    out = self.variant(module.apply)(variables, q, k)
    chex.assert_shape(out, (2, 2, 3, 4))
    expected = ref._pairwise_ref(q, k, 2, lambda h, i, j: table[ref.t5_bucket_ref(i - j, 16,
                                                                                 64), h])
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def _dape_inputs(seed, b=2, h=3, t=6):
  rng = np.random.default_rng(seed)
  scores = rng.normal(size=(b, h, t, t)).astype(np.float32)
  pos = jnp.arange(t)[None]
  bias = np.asarray(E.kerple_log_bias(pos, pos, jnp.array([0.5, 1.0, 1.5][:h]),
                                      jnp.array([0.3, 0.6, 0.9][:h])))
  return scores, bias


class DapeTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_v1_matches_loop_mlp(self):
    scores, bias = _dape_inputs(0)
    module = E.DapeV1(num_heads=3, hidden=5)
    variables = module.init(jax.random.key(0), scores, bias)
    out = self.variant(module.apply)(variables, scores, bias)
    chex.assert_shape(out, scores.shape)
    prm = jax.tree.map(np.asarray, variables['params'])
    chex.assert_shape(prm['w_in'], (6, 5))
    expected = ref.dape_v1_ref(scores, bias, prm['w_in'], prm['b_in'], prm['w_out'],
                               prm['b_out'])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_v1_without_bias_features(self):
    scores, _ = _dape_inputs(1)
    module = E.DapeV1(num_heads=3, hidden=4, use_bias_features=False)
    variables = module.init(jax.random.key(1), scores)
    out = self.variant(module.apply)(variables, scores)
    prm = jax.tree.map(np.asarray, variables['params'])
    chex.assert_shape(prm['w_in'], (3, 4))
    expected = ref.dape_v1_ref(scores, None, prm['w_in'], prm['b_in'], prm['w_out'],
                               prm['b_out'])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match='needs a bias'):
      E.DapeV1(num_heads=3).init(jax.random.key(0), scores)

  @chex.variants(with_jit=True, without_jit=True)
  def test_v2_matches_loop_conv(self):
    scores, bias = _dape_inputs(2, b=1, t=7)
    module = E.DapeV2(num_heads=3, hidden=4, kernel_size=3)
    variables = module.init(jax.random.key(2), scores, bias)
    prm = jax.tree.map(np.asarray, variables['params'])
    chex.assert_shape(prm['w_in'], (3, 6, 4))
    out = self.variant(module.apply)(variables, scores, bias)
    chex.assert_shape(out, scores.shape)
    expected = ref.dape_v2_ref(scores, bias, prm['w_in'], prm['b_in'], prm['w_out'],
                               prm['b_out'])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)

  def test_v2_without_bias_features_matches_loop_conv(self):
    scores, bias = _dape_inputs(7, b=1, t=5)
    module = E.DapeV2(num_heads=3, hidden=4, kernel_size=3, use_bias_features=False)
    variables = module.init(jax.random.key(7), scores)
    prm = jax.tree.map(np.asarray, variables['params'])
    chex.assert_shape(prm['w_in'], (3, 3, 4))
    out = module.apply(variables, scores)
    chex.assert_shape(out, scores.shape)
    expected = ref.dape_v2_ref(scores, None, prm['w_in'], prm['b_in'], prm['w_out'],
                               prm['b_out'])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    # A given bias is added to the logits but is not a feature of the convolution.
    with_bias = module.apply(variables, scores, bias)
    np.testing.assert_allclose(with_bias, expected + bias, rtol=1e-5, atol=1e-5)

  @parameterized.parameters(3, 5)
  def test_v2_blockwise_with_halo_equals_full_cropped(self, kernel_size):
    t, blk = 12, 4
    scores, bias = _dape_inputs(3, b=2, t=t)
    module = E.DapeV2(num_heads=3, hidden=4, kernel_size=kernel_size)
    variables = module.init(jax.random.key(3), scores, bias)
    full = np.asarray(module.apply(variables, scores, bias))
    halo = E.dapev2_halo(kernel_size)
    assert halo == 2 * (kernel_size // 2)
    garbage = np.random.default_rng(4).normal(size=(100,)) * 50
    apply = jax.jit(module.apply)
    for q0 in range(0, t, blk):
      for k0 in range(0, t, blk):
        keys = np.arange(k0 - halo, k0 + blk + halo)
        inside = (keys >= 0) & (keys < t)
        safe = np.clip(keys, 0, t - 1)
        s_blk = scores[:, :, q0:q0 + blk][..., safe]
        b_blk = bias[:, :, q0:q0 + blk][..., safe]
        s_blk = np.where(inside, s_blk, garbage[0])  # values outside [0, T) must not matter
        b_blk = np.where(inside, b_blk, garbage[1])
        q_pos = jnp.arange(q0, q0 + blk)[None]
        k_pos = jnp.asarray(keys)[None]
        valid = jnp.broadcast_to(jnp.asarray(inside)[None], (2, len(keys)))
        out = apply(variables, s_blk, b_blk, q_pos, k_pos, valid)
        chex.assert_shape(out, (2, 3, blk, blk + 2 * halo))
        np.testing.assert_allclose(out[..., halo:halo + blk],
                                   full[:, :, q0:q0 + blk, k0:k0 + blk], rtol=1e-5, atol=1e-5,
                                   err_msg=f'block q0={q0} k0={k0}')

  @parameterized.parameters('v1', 'v2')
  def test_future_keys_do_not_change_the_past(self, version):
    scores, bias = _dape_inputs(5, b=1, t=8)
    module = (E.DapeV1 if version == 'v1' else E.DapeV2)(num_heads=3, hidden=4)
    variables = module.init(jax.random.key(5), scores, bias)
    future = np.triu(np.ones((8, 8), bool), k=1)
    noisy_s = np.where(future, 1e3 * np.random.default_rng(6).normal(size=scores.shape), scores)
    noisy_b = np.where(future, -77.0, bias)
    a = np.asarray(module.apply(variables, scores, bias))
    b = np.asarray(module.apply(variables, noisy_s.astype(np.float32),
                                noisy_b.astype(np.float32)))
    np.testing.assert_allclose(a[..., ~future], b[..., ~future], rtol=1e-6, atol=1e-6)
    assert not np.allclose(a[..., future], b[..., future])

  def test_v2_errors(self):
    scores, bias = _dape_inputs(0)
    with pytest.raises(ValueError, match='odd'):
      E.DapeV2(num_heads=3, kernel_size=4).init(jax.random.key(0), scores, bias)
    with pytest.raises(ValueError, match='needs a bias'):
      E.DapeV2(num_heads=3).init(jax.random.key(0), scores)


def test_every_bias_broadcasts_a_batch_of_one_against_positions():
  q = jnp.arange(4)[None]
  k = jnp.arange(6)[None]
  for module in (E.KerpleLogBias(2), E.FireBias(2, hidden=3), E.T5RelativeBias(2)):
    out = module.apply(module.init(jax.random.key(0), q, k), q, k)
    chex.assert_shape(out, (1, 2, 4, 6))
    assert out.dtype == jnp.float32
