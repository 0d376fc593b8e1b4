"""Encoder mode (`model.causal=False`): bidirectional attention with two-sided biases
(bipe_jax/encodings/two_sided.py). Outputs depend on later tokens; one attention layer equals a
NumPy loop reference on the dense and the blockwise paths; the paths that cannot run it refuse."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import model as model_lib
from bipe_jax.config import ModelConfig
from bipe_jax.encodings import alibi
from bipe_jax.encodings import rope
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
                                           ('dape_kerple', 'blockwise')])
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
      assert first_changes > 1e-4, (encoding, impl)


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
