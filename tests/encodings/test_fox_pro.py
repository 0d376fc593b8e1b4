"""FoX Pro (key / value shift, QK-norm, gated output norm) and FoX's fixed gate against loop
references written from the official formulas (encodings/fox_pro.py), on the dense, blockwise
and Pallas (interpret mode) paths, causal and in encoder mode, with padding and packed
documents. Decode == full forward and training of fox_pro / bipe_fox_pro run in
tests/model/test_model.py::test_every_scheme."""

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax.encodings import fox_pro

B, T, D, H, G = 2, 10, 16, 4, 2
DH = D // H


def _np(x):
  return np.asarray(x, np.float64)


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def _shift_ref(x_BxGxTxDh, alpha_BxTxG, keep_BxT, continues_BxT):
  """out_t = a_t x_{t-1} + (1 - a_t) x_t, one token at a time; masked x is 0, and the previous
  token is 0 at t = 0 and where the row does not continue."""
  x = _np(x_BxGxTxDh) * np.asarray(keep_BxT, bool)[:, None, :, None]
  out = np.zeros_like(x)
  for b in range(x.shape[0]):
    for g in range(x.shape[1]):
      for t in range(x.shape[2]):
        a = float(alpha_BxTxG[b, t, g])
        prev = x[b, g, t - 1] if t > 0 and continues_BxT[b, t] else 0.0
        out[b, g, t] = a * prev + (1.0 - a) * x[b, g, t]
  return out


def _rms_ref(x, scale, eps):
  out = np.zeros_like(x)
  for idx in np.ndindex(*x.shape[:-1]):
    v = x[idx]
    out[idx] = v / math.sqrt(np.mean(v * v) + eps) * scale[idx[1]]
  return out


def test_token_shift_matches_the_loop_reference():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B, G, T, DH)).astype(np.float32)
  alpha = rng.uniform(size=(B, T, G)).astype(np.float32)
  keep = np.ones((B, T), bool)
  keep[1, :3] = False  # left padding
  continues = np.ones((B, T), bool)
  continues[0, 6] = False  # a document starts at 6
  for fn in (fox_pro.token_shift, jax.jit(fox_pro.token_shift)):
    got = fn(jnp.asarray(x), jnp.asarray(alpha), jnp.asarray(keep), jnp.asarray(continues))
    chex.assert_shape(got, (B, G, T, DH))
    np.testing.assert_allclose(np.asarray(got), _shift_ref(x, alpha, keep, continues),
                               rtol=1e-6, atol=1e-6)
  # a carried previous token enters only at t = 0
  before = rng.normal(size=(B, G, DH)).astype(np.float32)
  got = fox_pro.token_shift(jnp.asarray(x), jnp.asarray(alpha), jnp.asarray(keep),
                            jnp.asarray(continues), jnp.asarray(before))
  plain = _shift_ref(x, alpha, keep, continues)
  want0 = alpha[:, 0, :, None] * before + (1 - alpha[:, 0, :, None]) * x[:, :, 0] * keep[:, 0,
                                                                                        None, None]
  np.testing.assert_allclose(np.asarray(got[:, :, 0]), want0, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got[:, :, 1:]), plain[:, :, 1:], rtol=1e-6, atol=1e-6)


def test_fixed_gate_decay_times_hand_example():
  """Two heads, decay times 4 and 16: sigmoid(b) = exp(-1 / tau)."""
  b = fox_pro.decay_time_biases(2, 4.0, 16.0)
  np.testing.assert_allclose(_sigmoid(_np(b)), np.exp(-1.0 / np.array([4.0, 16.0])), rtol=1e-6)
  mid = fox_pro.decay_time_biases(3, 4.0, 16.0)  # log-spaced: 4, 8, 16
  np.testing.assert_allclose(-1.0 / np.log(_sigmoid(_np(mid))), [4.0, 8.0, 16.0], rtol=1e-5)
  with pytest.raises(ValueError, match='0 < min <= max'):
    fox_pro.decay_time_biases(2, 16.0, 4.0)


def _cfg(encoding='fox_pro', impl='dense', **extra):
  return config_lib.ModelConfig(vocab_size=16, hidden_size=D, num_layers=1, num_heads=H,
                                num_kv_heads=G, ffn_size=16, position_encoding=encoding,
                                separator_ids=(3,), max_intra=16, attention_impl=impl,
                                block_size=4, **extra)


def _side(valid, document):
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  return model_lib.Side(index=pos, token=pos, intra=pos, inter=pos, document=document,
                        valid=valid, paragraph=0 * pos, sentence=pos)


def _pro_ref(x, p, cfg, valid, document, causal=True):
  """The whole Pro attention layer in float64, one token / pair at a time: shifted k and v,
  QK-norm, scores + the FoX bias (literal sums of log f; in encoder mode the two-sided rule),
  softmax over the visible keys, gated output norm, output projection."""
  x = _np(x)
  valid, document = np.asarray(valid, bool), np.asarray(document)
  proj = lambda n: np.einsum('btd,dhk->bhtk', x, _np(p[n]['kernel']))
  continues = np.ones((B, T), bool)
  if cfg.mask_across_documents:
    continues[:, 1:] = document[:, 1:] == document[:, :-1]
  shifted = {}
  for n in ('key', 'value'):
    alpha = _sigmoid(np.einsum('btd,dg->btg', x, _np(p[f'{n}_shift']['kernel'])))
    shifted[n] = _shift_ref(proj(n), alpha, valid, continues)
  q = _rms_ref(proj('query'), _np(p['q_norm']['scale']), fox_pro.QK_NORM_EPS)
  k = _rms_ref(shifted['key'], _np(p['k_norm']['scale']), fox_pro.QK_NORM_EPS)
  v = shifted['value']
  if cfg.fox_gate == 'fixed':
    log_f = np.broadcast_to(np.log(_sigmoid(_np(fox_pro.decay_time_biases(
        H, cfg.fox_decay_time_min, cfg.fox_decay_time_max)))), (B, T, H))
  else:
    z = _np(p['forget_gate']['bias']) + np.einsum('btd,dh->bth', x,
                                                   _np(p['forget_gate']['kernel']))
    log_f = -np.log1p(np.exp(-z))
  log_f = log_f * valid[:, :, None]
  out = np.zeros((B, H, T, DH))
  for b in range(B):
    for h in range(H):
      g = h // (H // G)
      for i in range(T):
        logits, keys = [], []
        for j in range(T):
          if not valid[b, j] or (causal and j > i):
            continue
          if cfg.mask_across_documents and document[b, j] != document[b, i]:
            continue
          bias = (sum(log_f[b, l, h] for l in range(j + 1, i + 1)) if j <= i else
                  sum(log_f[b, l, h] for l in range(i + 1, j + 1)) + 0.5 * log_f[b, j, h])
          logits.append(np.dot(q[b, h, i], k[b, g, j]) / math.sqrt(DH) + bias)
          keys.append(j)
        if not keys:  # a padded query with no visible key: its output is not compared
          continue
        w = np.exp(np.array(logits) - max(logits))
        w /= w.sum()
        out[b, h, i] = sum(wi * v[b, g, j] for wi, j in zip(w, keys))
  gate = _sigmoid(np.einsum('btd,dhk->bhtk', x, _np(p['output_gate']['gate'])))
  out = _rms_ref(out, _np(p['output_gate']['norm']['scale']), fox_pro.OUTPUT_NORM_EPS) * gate
  return np.einsum('bhtk,hkd->btd', out, _np(p['out']['kernel']))


def _layer(cfg, valid, document, seed=0):
  x = jax.random.normal(jax.random.PRNGKey(1), (B, T, D), jnp.float32)
  side = _side(valid, document)
  layer = model_lib.Attention(cfg, mask_keys=True)
  params = layer.init(jax.random.PRNGKey(seed), x, side, side, jnp.zeros((), jnp.int32))
  # Non-trivial gates and norm scales (their inits are zeros and ones), shift weights large
  # enough that the shift matters.
  params = jax.tree_util.tree_map_with_path(
      lambda path, a: (a + 0.5 * jax.random.normal(jax.random.PRNGKey(len(str(path))), a.shape)
                       if any(n in str(path) for n in ("'bias'", "'scale'", 'shift', 'gate'))
                       else a), params)
  apply = lambda prm, v: layer.apply(prm, v, side, side, jnp.zeros((), jnp.int32))
  return x, params, apply


_VALID = jnp.ones((B, T), bool).at[1, :2].set(False)  # row 1 left-padded
_ONE_DOC = jnp.zeros((B, T), jnp.int32)
_TWO_DOCS = _ONE_DOC.at[:, 6:].set(1)


@pytest.mark.parametrize('impl,extra,document', [
    ('dense', {}, _ONE_DOC),
    ('blockwise', {}, _ONE_DOC),
    ('pallas', {}, _ONE_DOC),
    ('blockwise', {'mask_across_documents': True}, _TWO_DOCS),
    ('dense', {'fox_gate': 'fixed', 'fox_decay_time_min': 2.0, 'fox_decay_time_max': 64.0},
     _ONE_DOC),
    ('dense', {'causal': False}, _ONE_DOC),
], ids=['dense', 'blockwise', 'pallas', 'documents', 'fixed_gate', 'encoder'])
def test_pro_attention_equals_the_loop_reference(impl, extra, document):
  cfg = _cfg(impl=impl, **extra)
  x, params, apply = _layer(cfg, _VALID, document)
  want = _pro_ref(x, params['params'], cfg, _VALID, document, causal=cfg.causal)
  got = jax.jit(apply)(params, x)
  chex.assert_shape(got, (B, T, D))
  keep = np.asarray(_VALID)  # padded queries' outputs are not defined
  np.testing.assert_allclose(np.asarray(got)[keep], want[keep], rtol=2e-4, atol=2e-5)
  if impl == 'dense':  # eager too
    np.testing.assert_allclose(np.asarray(apply(params, x))[keep], want[keep], rtol=2e-4,
                               atol=2e-5)


@pytest.mark.parametrize('impl', ['blockwise', 'pallas'])
def test_pro_gradients_equal_dense(impl):
  """Input and parameter gradients of every path equal the dense path's."""
  grads = {}
  for path in ('dense', impl):
    x, params, apply = _layer(_cfg(impl=path), _VALID, _ONE_DOC)
    loss = lambda prm, v, apply=apply: jnp.sum(jnp.sin(apply(prm, v)) * _VALID[:, :, None])
    grads[path] = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
  chex.assert_trees_all_close(grads[impl], grads['dense'], rtol=1e-4, atol=1e-5)
  assert float(jnp.max(jnp.abs(grads['dense'][0]['params']['key_shift']['kernel']))) > 0


def test_parameters_of_the_pro_layer_and_the_fixed_gate():
  shapes = lambda cfg: nn.meta.unbox(jax.eval_shape(
      lambda: model_lib.Transformer(cfg).init(jax.random.PRNGKey(0),
                                              jnp.zeros((1, 4), jnp.int32))))['params']
  attn = shapes(_cfg('bipe_fox_pro'))['layer_0']['attention']
  assert attn['key_shift']['kernel'].shape == (D, G)
  assert attn['value_shift']['kernel'].shape == (D, G)
  assert attn['q_norm']['scale'].shape == (H, DH) and attn['k_norm']['scale'].shape == (G, DH)
  assert attn['output_gate']['gate'].shape == (D, H, DH)
  assert attn['output_gate']['norm']['scale'].shape == (H, DH)
  assert attn['forget_gate']['kernel'].shape == (D, H)
  fixed = shapes(_cfg('fox', fox_gate='fixed', fox_decay_time_min=1.0,
                      fox_decay_time_max=8.0))['layer_0']['attention']
  assert 'forget_gate' not in fixed and 'key_shift' not in fixed  # constant gates, plain FoX


@pytest.mark.parametrize('fields,match', [
    ({'position_encoding': 'rope', 'fox_gate': 'fixed', 'fox_decay_time_min': 1.0,
      'fox_decay_time_max': 2.0}, 'needs a FoX encoding'),
    ({'fox_gate': 'fixed'}, '0 < min <= max'),
    ({'fox_gate': 'data'}, "must be 'learned' or 'fixed'"),
])
def test_bad_fox_gate_settings_are_refused_in_one_line(fields, match):
  with pytest.raises(ValueError, match=match) as err:
    _cfg(**{'encoding': fields.pop('position_encoding', 'fox_pro'), **fields})
  assert '\n' not in str(err.value)
