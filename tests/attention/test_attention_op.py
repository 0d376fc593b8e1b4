"""attention/op.py: the op picks the implementation, forms each one's arguments from the scheme's
positional terms (per-key ALiBi for fused, TileBias + per-head parameters for Pallas, a bias_fn
made two-sided in encoder mode for dense / blockwise) and refuses in one line an implementation
that does not compute the scheme. Outputs are checked against a loop-based NumPy attention."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import attention
from bipe_jax import schemes
from bipe_jax.attention import op as attention_op
from bipe_jax.encodings import alibi
from bipe_jax.encodings import kerple

B, H, G, T, D = 2, 4, 2, 12, 8
_RNG = np.random.default_rng(0)
Q, K, V = (np.asarray(_RNG.normal(size=s), np.float32)
           for s in ((B, H, T, D), (B, G, T, D), (B, G, T, D)))
POS = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T))
INTER = np.cumsum(_RNG.random((B, T)) < 0.3, axis=1).astype(np.int32)  # segment ids
SLOPES = np.asarray([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])  # ALiBi, H a power of 2


def _reference(bias_HxQxK_of_row, causal=True):
  """Loop-based attention [B, H, T, D]: softmax(q.k / sqrt(D) + bias) v over visible keys."""
  out = np.zeros((B, H, T, D))
  for b in range(B):
    bias = bias_HxQxK_of_row(b)
    for h in range(H):
      g = h // (H // G)
      for i in range(T):
        keys = [j for j in range(T) if j <= i or not causal]
        logits = np.asarray([Q[b, h, i] @ K[b, g, j] / np.sqrt(D) + bias[h, i, j] for j in keys])
        w = np.exp(logits - logits.max())
        w /= w.sum()
        out[b, h, i] = sum(w_j * V[b, g, j] for w_j, j in zip(w, keys))
  return out


def _alibi_reference(factor, two_sided=False):
  """ALiBi on the inter stream: -factor * m_h * max(p_i - p_j, 0); two-sided: keys of a later
  segment (p_j > p_i) at the mirrored distance p_j - p_i + 1/2."""
  def bias(b):
    p = INTER[b].astype(np.float64)
    d = p[:, None] - p[None, :]
    if two_sided:
      d = np.where(d >= 0, d, -d + 0.5)
    return -factor * SLOPES[:, None, None] * np.maximum(d, 0.0)[None]
  return bias


def _alibi_term(factor=3.0):
  fn = functools.partial(alibi.alibi_bias, slopes_H=alibi.alibi_slopes(H), slope_factor=factor)
  return attention_op.BiasTerm('alibi', jnp.asarray(INTER), jnp.asarray(INTER), bias_fn=fn,
                               slope_factor=factor)


def _mask(causal=True):
  return attention.AttentionMask(q_pos=jnp.asarray(POS), k_pos=jnp.asarray(POS), causal=causal)


def _op(impl, name, **kw):
  return attention_op.AttentionOp(impl, schemes.get_scheme(name), block_size=8, **kw)


@pytest.mark.parametrize('impl', ['dense', 'blockwise', 'fused'])
def test_alibi_on_each_implementation_equals_the_reference(impl):
  out = _op(impl, 'bipe_alibi')(Q, K, V, _mask(), _alibi_term())
  np.testing.assert_allclose(out, _reference(_alibi_reference(3.0)), atol=2e-5, rtol=2e-5)


def test_encoder_mode_makes_the_bias_two_sided():
  out = _op('blockwise', 'bipe_alibi')(Q, K, V, _mask(causal=False), _alibi_term())
  np.testing.assert_allclose(out, _reference(_alibi_reference(3.0, two_sided=True), causal=False),
                             atol=2e-5, rtol=2e-5)


def test_each_implementation_receives_its_own_arguments():
  bias, mask = _alibi_term(), _mask()
  fused = _op('fused', 'bipe_alibi').arguments('fused', mask, H, D, bias)
  assert set(fused) == {'mask', 'transform_fn', 'key_bias_BxHx1xK', 'plain_causal'}
  expected = 3.0 * SLOPES[None, :, None, None] * INTER[:, None, None, :]  # s * m_h * p_k
  np.testing.assert_allclose(fused['key_bias_BxHx1xK'], expected, rtol=1e-6)

  blockwise = _op('blockwise', 'bipe_alibi').arguments('blockwise', mask, H, D, bias)
  assert {'bias_fn', 'q_streams', 'k_streams', 'block_size', 'transform_halo',
          'kernels'} <= set(blockwise)
  assert blockwise['block_size'] == 8 and blockwise['bias_fn'] is bias.bias_fn

  tiles = _op('pallas', 'bipe_alibi').arguments('pallas', mask, H, D, bias)
  assert tiles['tile_bias'].kind == 'alibi' and (tiles['block_q'], tiles['block_k']) == (8, 8)
  np.testing.assert_allclose(tiles['bias_params_HxP'][:, 0], 3.0 * SLOPES, rtol=1e-6)
  assert 'bias_fn' not in tiles and 'kernels' not in tiles

  fox_term = attention_op.BiasTerm('fox', None, None, fox_log_pruning_tolerance=-9.0)
  fox_blocks = _op('blockwise', 'fox').arguments('blockwise', mask, H, D, fox_term)
  assert 'block_prune' in fox_blocks
  fox_tiles = _op('pallas', 'fox').arguments('pallas', mask, H, D, fox_term)
  assert fox_tiles['tile_bias'].kind == 'fox' and fox_tiles['fox_log_pruning_tolerance'] == -9.0


def test_kerple_tiles_take_the_clamped_parameters():
  """The Pallas kernel (interpret mode) gets Kerple's (p, a) clamped at 0.01, as the dense bias
  module uses them: a p below the clamp gives the clamped bias."""
  p, a = np.asarray([0.001, 0.5, 1.0, 2.0]), np.asarray([0.3, 0.005, 1.5, 0.1])
  term = attention_op.BiasTerm('kerple', jnp.asarray(POS), jnp.asarray(POS),
                               params={'p': jnp.asarray(p, jnp.float32),
                                       'a': jnp.asarray(a, jnp.float32)})
  args = _op('pallas', 'kerple').arguments('pallas', _mask(), H, D, term)
  np.testing.assert_allclose(args['bias_params_HxP'],
                             np.stack([np.maximum(p, kerple.KERPLE_MIN),
                                       np.maximum(a, kerple.KERPLE_MIN)], axis=1), rtol=1e-6)
  out = _op('pallas', 'kerple')(Q, K, V, _mask(), term)
  pc, ac = np.maximum(p, 0.01), np.maximum(a, 0.01)

  def bias(b):
    d = np.maximum(POS[b][:, None] - POS[b][None, :], 0).astype(np.float64)
    return -pc[:, None, None] * np.log1p(ac[:, None, None] * d[None])

  np.testing.assert_allclose(out, _reference(bias), atol=2e-5, rtol=2e-5)


def test_the_implementation_chosen():
  assert jax.default_backend() == 'cpu'  # the suite's platform: 'auto' is blockwise there
  assert _op('auto', 'bipe_alibi').implementation() == 'blockwise'
  assert _op('pallas', 'bipe_alibi', decode=True).implementation() == 'dense'
  assert _op('fused', 'rope', decode=True).implementation() == 'dense'
  dense_only = attention_op.TransformTerm(lambda *a: a[0], dense_only=True)
  assert _op('blockwise', 'cope').implementation(True, dense_only) == 'dense'
  assert _op('blockwise', 'bipe_alibi').implementation() == 'blockwise'


@pytest.mark.parametrize('impl,name', [('pallas_gpu', 'fox'), ('cudnn', 'bipe_alibi'),
                                       ('fused', 'kerple'), ('pallas', 'dape_fire')])
def test_an_implementation_that_does_not_compute_the_scheme_is_refused(impl, name):
  with pytest.raises(ValueError, match=f"attention_impl='{impl}': .*use blockwise or dense") as e:
    _op(impl, name)(Q, K, V, _mask())
  assert '\n' not in str(e.value)


def test_pallas_fuses_dape_v1_and_refuses_it_in_encoder_mode():
  """DAPE V1 on ALiBi: the TPU kernel (interpret mode here) equals dense DAPE through the op;
  in encoder mode (a two-sided bias the kernel does not make) it is refused in one line."""
  num_features, hidden = 2 * H, 4
  rng = np.random.default_rng(3)
  params = {'w_in': rng.normal(size=(num_features, hidden)) * 0.3, 'b_in': rng.normal(size=hidden),
            'w_out': rng.normal(size=(hidden, H)) * 0.3, 'b_out': rng.normal(size=H)}
  params = {n: jnp.asarray(p, jnp.float32) for n, p in params.items()}
  from bipe_jax.encodings import dape  # pylint: disable=import-outside-toplevel
  transform = attention_op.TransformTerm(
      lambda s, b, *_: dape.dape_v1_transform(s, b, params), kind='dape_v1', params=params)
  fused = _op('pallas', 'dape_alibi')(Q, K, V, _mask(), _alibi_term(), transform)
  dense = _op('dense', 'dape_alibi')(Q, K, V, _mask(), _alibi_term(), transform)
  np.testing.assert_allclose(fused, dense, atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match='causal attention only') as e:
    _op('pallas', 'dape_alibi')(Q, K, V, _mask(causal=False), _alibi_term(), transform)
  assert '\n' not in str(e.value)
