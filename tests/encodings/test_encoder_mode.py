"""Encoder mode (`model.causal=False`): bidirectional attention with two-sided biases
(bipe_jax/encodings/two_sided.py). Outputs depend on later tokens; one attention layer equals a
NumPy loop reference on the dense and the blockwise paths; the paths that cannot run it refuse."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import model as model_lib
from bipe_jax.config import ModelConfig
from bipe_jax.encodings import alibi
from bipe_jax.encodings import fox
from bipe_jax.encodings import rope
from bipe_jax.encodings import two_sided
from tests import reference_numpy as ref

T, D, H = 10, 16, 2


def _cfg(encoding, impl='dense', causal=False, num_layers=2, **kw):
  return ModelConfig(vocab_size=11, hidden_size=D, num_layers=num_layers, num_heads=H, ffn_size=32,
                     position_encoding=encoding, max_intra=16, max_position=32, train_length=8,
                     separators='ids', separator_ids=(3,), bos_id=-1, eos_id=-1,
                     attention_impl=impl, block_size=4, causal=causal, **kw)


@pytest.mark.parametrize('encoding,impl', [('nope', 'dense'), ('alibi', 'dense'),
                                           ('bipe_rope', 'dense'), ('rope', 'blockwise'),
                                           ('kerple', 'blockwise'), ('fire', 'blockwise'),
                                           ('dape_kerple', 'blockwise'), ('fox', 'blockwise'),
                                           ('bipe_fox', 'blockwise'), ('cope', 'dense')])
def test_outputs_depend_on_later_tokens(encoding, impl):
  """Changing the last token changes the first position's logits in the encoder, not in the
  decoder (the same params; both rows in one batch, one compile per mode)."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, size=(1, T)), jnp.int32)
  both = jnp.concatenate([tokens, tokens.at[:, -1].set((tokens[:, -1] + 1) % 11)])
  params = None
  for causal in (False, True):
    module = model_lib.Transformer(_cfg(encoding, impl, causal, num_layers=1))
    params = params or module.init(jax.random.PRNGKey(0), both)
    logits = jax.jit(module.apply)(params, both)
    first_changes = float(jnp.max(jnp.abs(logits[0, 0] - logits[1, 0])))
    if causal:
      assert first_changes == 0.0
    else:
      assert first_changes > 1e-6, (encoding, impl)  # FoX: the last key decays by ~e^-6


def _bias_value(encoding, p, cfg):
  """(h, i, j) -> the two-sided bias of the query i and key j, written out per encoding."""
  def dist(i, j):  # past keys: i - j; future keys: half a position further than j - i
    return i - j if j <= i else j - i + 0.5
  if encoding == 'nope' or encoding == 'rope':
    return lambda h, i, j: 0.0
  if encoding == 'alibi':
    slopes = alibi.alibi_slopes(H)
    return lambda h, i, j: -slopes[h] * dist(i, j)
  if encoding in ('kerple', 'dape_kerple'):
    pk, ak = (np.maximum(np.asarray(p['kerple'][n], np.float64), 0.01) for n in ('p', 'a'))
    return lambda h, i, j: -pk[h] * math.log(1.0 + ak[h] * dist(i, j))
  if encoding == 'fire':
    f = {k: np.asarray(v, np.float64) for k, v in p['fire'].items()}
    psi = lambda x: math.log(abs(f['c'] * x) + 1.0)
    threshold = abs(float(f['L_multiplier']) * cfg.fire_L0)

    def value(h, i, j):
      d = psi(dist(i, j)) / (psi(max(i, threshold) if j <= i else threshold) + 1e-6)
      hidden = [max(d * f['w_in'][0, n] + f['b_in'][n], 0.0) for n in range(len(f['b_in']))]
      return sum(hidden[n] * f['w_out'][n, h] for n in range(len(hidden))) + f['b_out'][h]
    return value
  raise ValueError(encoding)


def _attention_ref(x, p, cfg, encoding, pos):
  x = np.asarray(x, np.float64)
  proj = lambda n: np.einsum('btd,dhk->bhtk', x, np.asarray(p[n]['kernel'], np.float64))
  q, k, v = proj('query'), proj('key'), proj('value')
  if encoding == 'rope':
    inv = rope.rope_inv_frequencies(cfg.head_size, cfg.rope_base)
    q, k = ref.rope_ref(q, pos, inv), ref.rope_ref(k, pos, inv)
  scores = np.einsum('bhqd,bhkd->bhqk', q, k) / math.sqrt(cfg.head_size)
  value = _bias_value(encoding, p, cfg)
  bias = np.array([[[[value(h, i, j) for j in range(T)] for i in range(T)] for h in range(H)]])
  if encoding == 'dape_kerple':
    dp = {n: np.asarray(a, np.float64) for n, a in p['dape'].items()}
    logits = ref.dape_v1_ref(scores, bias, dp['w_in'], dp['b_in'], dp['w_out'], dp['b_out'])
  else:
    logits = scores + bias
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)  # over ALL keys: no causal mask
  out = np.einsum('bhqk,bhkd->bhqd', weights, v)
  return np.einsum('bhtk,hkd->btd', out, np.asarray(p['out']['kernel'], np.float64))


@pytest.mark.parametrize('encoding,impl', [
    *[(e, 'dense') for e in ('nope', 'rope', 'alibi', 'kerple', 'fire', 'dape_kerple')],
    *[(e, 'blockwise') for e in ('rope', 'alibi', 'fire', 'dape_kerple')]])
def test_attention_equals_numpy_reference(encoding, impl):
  """Blockwise with block_size 4 < T = 10: the flash path over several key blocks."""
  cfg = _cfg(encoding, impl)
  x = jax.random.normal(jax.random.PRNGKey(1), (1, T, D), jnp.float32)
  pos = jnp.arange(T, dtype=jnp.int32)[None]
  side = model_lib.Side(index=pos, token=pos, intra=pos, inter=pos, document=0 * pos,
                        valid=pos >= 0, paragraph=0 * pos, sentence=pos)
  layer = model_lib.Attention(cfg)
  params = layer.init(jax.random.PRNGKey(2), x, side, side, jnp.zeros((), jnp.int32))
  apply = lambda v: layer.apply(params, v, side, side, jnp.zeros((), jnp.int32))
  want = _attention_ref(x, params['params'], cfg, encoding, np.asarray(pos))
  for fn in ((apply, jax.jit(apply)) if impl == 'dense' else (jax.jit(apply),)):
    np.testing.assert_allclose(np.asarray(fn(x)), want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize('impl,encoding', [('pallas', 'alibi'), ('fused', 'alibi'),
                                           ('blockwise', 'dapev2_kerple')])
def test_paths_that_cannot_refuse(impl, encoding):
  with pytest.raises(ValueError, match=r'model.causal=False is invalid: \(encoder mode\)'):
    _cfg(encoding, impl)


def test_fused_without_bias_runs_and_decode_refuses():
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, size=(1, T)), jnp.int32)
  fused, dense = (model_lib.Transformer(_cfg('rope', impl)) for impl in ('fused', 'dense'))
  params = dense.init(jax.random.PRNGKey(0), tokens)
  np.testing.assert_allclose(fused.apply(params, tokens), dense.apply(params, tokens),
                             rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match='encoder mode.*cannot decode'):
    dense.init(jax.random.PRNGKey(0), tokens, decode=True)


def _fox_cope_ref(x, p, cfg, encoding, scores, v):
  """The encoder-mode FoX / CoPE logits, one pair at a time (float64), then softmax over all
  keys. FoX: past keys sum the gates l = j+1..i, keys on the right the gates l = i+1..j plus
  half of the key's own gate. CoPE: past keys count g_it for t = j..i with table e, keys on the
  right count t = i..j with table e_right."""
  heads, t_len = scores.shape[1], scores.shape[2]
  logits = np.array(scores)
  if encoding in ('fox', 'fox_bias_only'):
    g = p['forget_gate']
    z = np.broadcast_to(np.asarray(g['bias'], np.float64), (1, t_len, heads)).copy()
    if 'kernel' in g:
      z = z + np.einsum('btd,dh->bth', x, np.asarray(g['kernel'], np.float64))
    log_f = -np.log1p(np.exp(-z))[0]
    for h in range(heads):
      for i in range(t_len):
        for j in range(t_len):
          if j <= i:
            logits[0, h, i, j] += sum(log_f[l, h] for l in range(j + 1, i + 1))
          else:
            logits[0, h, i, j] += (sum(log_f[l, h] for l in range(i + 1, j + 1))
                                   + 0.5 * log_f[j, h])
  else:
    q = np.einsum('btd,dhk->bhtk', x, np.asarray(p['query']['kernel'], np.float64))
    tables = {n: np.asarray(p[n]['embedding'], np.float64) for n in ('cope', 'cope_right')}
    npos = tables['cope'].shape[0]
    gates = 1.0 / (1.0 + np.exp(-np.asarray(scores)))
    for h in range(heads):
      for i in range(t_len):
        for j in range(t_len):
          span, table = ((range(j, i + 1), tables['cope']) if j <= i else
                         (range(i, j + 1), tables['cope_right']))
          pos = min(sum(gates[0, h, i, t] for t in span), npos - 1)
          lo, hi = math.floor(pos), math.ceil(pos)
          e = (pos - lo) * table[hi] + (1.0 - pos + lo) * table[lo]
          logits[0, h, i, j] += float(np.dot(q[0, h, i], e)) / math.sqrt(cfg.head_size)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  out = np.einsum('bhqk,bhkd->bhqd', weights, v)
  return np.einsum('bhtk,hkd->btd', out, np.asarray(p['out']['kernel'], np.float64))


def _layer_and_inputs(encoding, impl, seed=2):
  cfg = _cfg(encoding, impl, cope_npos=6)
  x = jax.random.normal(jax.random.PRNGKey(1), (1, T, D), jnp.float32)
  pos = jnp.arange(T, dtype=jnp.int32)[None]
  side = model_lib.Side(index=pos, token=pos, intra=pos, inter=pos, document=0 * pos,
                        valid=pos >= 0, paragraph=0 * pos, sentence=pos)
  layer = model_lib.Attention(cfg)
  params = layer.init(jax.random.PRNGKey(seed), x, side, side, jnp.zeros((), jnp.int32))
  # Non-trivial gates and position tables (their inits are zeros)
  params = jax.tree_util.tree_map_with_path(
      lambda path, a: (jax.random.normal(jax.random.PRNGKey(len(str(path))), a.shape) * 0.5
                       if any(n in str(path) for n in ('cope', "'bias'")) else a), params)
  apply = lambda prm, v: layer.apply(prm, v, side, side, jnp.zeros((), jnp.int32))
  return cfg, x, params, apply


@pytest.mark.parametrize('encoding,impl', [('fox', 'dense'), ('fox', 'blockwise'),
                                           ('fox_bias_only', 'blockwise'), ('cope', 'dense')])
def test_fox_and_cope_encoder_attention_equals_numpy_reference(encoding, impl):
  cfg, x, params, apply = _layer_and_inputs(encoding, impl)
  p = params['params']
  x64 = np.asarray(x, np.float64)
  proj = lambda n: np.einsum('btd,dhk->bhtk', x64, np.asarray(p[n]['kernel'], np.float64))
  scores = np.einsum('bhqd,bhkd->bhqk', proj('query'), proj('key')) / math.sqrt(cfg.head_size)
  want = _fox_cope_ref(x64, p, cfg, encoding, scores, proj('value'))
  for fn in (apply, jax.jit(apply)):
    np.testing.assert_allclose(np.asarray(fn(params, x)), want, rtol=2e-4, atol=2e-5)


def test_fox_encoder_gradients_blockwise_equal_dense():
  """The flash VJP of the two-sided FoX bias (float streams c and log f) against dense."""
  grads = []
  for impl in ('dense', 'blockwise'):
    _, x, params, apply = _layer_and_inputs('fox', impl)
    loss = lambda prm, v: jnp.sum(jnp.sin(apply(prm, v)))
    grads.append(jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x))
  chex.assert_trees_all_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)


def test_two_sided_fox_with_constant_gates_is_two_sided_alibi():
  """log f = -m on every token: the FoX encoder bias equals ALiBi's two-sided bias."""
  slopes = alibi.alibi_slopes(H)
  pos = jnp.arange(T, dtype=jnp.int32)[None]
  log_f = jnp.broadcast_to(-jnp.asarray(slopes, jnp.float32), (1, T, H))
  c = fox.cumulative_log_gates(log_f) + 3.0  # any offset
  got = fox.fox_bias_two_sided((c, pos), (c, log_f, pos))
  want = two_sided.two_sided_bias(
      lambda q, k: -jnp.asarray(slopes)[None, :, None, None] * jnp.maximum(
          q[:, None, :, None] - k[:, None, None, :], 0))(pos, pos)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  chex.assert_shape(got, (1, H, T, T))


def test_fox_pruning_is_refused_in_encoder_mode():
  with pytest.raises(ValueError, match='fox_log_pruning_tolerance.*causal=False'):
    _cfg('fox', 'blockwise', fox_log_pruning_tolerance=-5.0)
