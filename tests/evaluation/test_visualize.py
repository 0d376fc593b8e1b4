"""eval/visualize.py's logic: the attention probe (bipe_jax/evaluation/attention_probe.py) against
a NumPy computation from the layer's parameters (q.k scores, Kerple bias, DAPE's MLP, causal
softmax), and the pictures + numbers written for a dape_kerple and a rope workdir."""

import json
import math
import os

import chex
import jax
import numpy as np
import pytest

from bipe_jax.runs import restore as runs_lib
from bipe_jax.encodings import kerple
from bipe_jax.evaluation import attention_probe
from bipe_jax.evaluation import visualize
from tests import reference_numpy
from tests.evaluation import test_evaluation_runs as run_fixtures

QUERY = 23  # a 24-token window: 1.5x the fixtures' training length 16, a small loop reference


@pytest.fixture(scope='module')
def dape_run(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('viz') / 'dape_kerple')
  run_fixtures._write_workdir(path, 'dape_kerple')  # pylint: disable=protected-access
  return runs_lib.load_run(path, attention_impl='dense')


def _window(run, length):
  from bipe_jax import data  # pylint: disable=g-import-not-at-top
  tokens, _ = data.make_eval_blocks(run.config.data, length, max_tokens=length)
  return tokens[:1]


def test_probe_equals_numpy_from_the_layer_parameters(dape_run):
  cfg, params = dape_run.model_config, jax.device_get(dape_run.params)
  tokens = _window(dape_run, QUERY + 1)
  layer = 1
  got = attention_probe.layer_logits(cfg, params, tokens, layer)
  t, h, g, dh = QUERY + 1, cfg.num_heads, cfg.kv_heads, cfg.head_size
  for name in ('scores', 'bias', 'logits', 'weights'):
    chex.assert_shape(got[name], (1, h, t, t))
  inputs, side = attention_probe.layer_inputs(cfg, params, tokens)
  x = np.asarray(inputs[layer], np.float64)[0]  # [T, D]
  attn = params[f'layer_{layer}']['attention']
  q = np.einsum('td,dhk->htk', x, np.asarray(attn['query']['kernel'], np.float64))
  k = np.einsum('td,dgk->gtk', x, np.asarray(attn['key']['kernel'], np.float64))
  scores = np.stack([q[i] @ k[i // (h // g)].T / math.sqrt(dh) for i in range(h)])[None]
  np.testing.assert_allclose(got['scores'], scores, rtol=1e-4, atol=1e-4)
  pos = np.asarray(side.token)
  p, a = (np.maximum(np.asarray(attn['kerple'][n], np.float64), kerple.KERPLE_MIN)
          for n in kerple.KERPLE_PARAM_NAMES)
  bias = reference_numpy.kerple_log_bias_ref(pos, pos, p, a)
  np.testing.assert_allclose(got['bias'], bias, rtol=1e-4, atol=1e-4)
  d = {n: np.asarray(v, np.float64) for n, v in attn['dape'].items()}
  logits = reference_numpy.dape_v1_ref(scores, bias, d['w_in'], d['b_in'], d['w_out'],
                                       d['b_out'])
  np.testing.assert_allclose(got['logits'], logits, rtol=1e-4, atol=1e-4)
  weights = np.zeros_like(logits)
  for i in range(h):
    for r in range(t):
      row = np.exp(logits[0, i, r, :r + 1] - logits[0, i, r, :r + 1].max())
      weights[0, i, r, :r + 1] = row / row.sum()
  np.testing.assert_allclose(got['weights'], weights, rtol=1e-4, atol=1e-6)


def test_dape_kerple_pictures_and_numbers(dape_run, tmp_path):
  cfg, params = dape_run.model_config, jax.device_get(dape_run.params)
  doc = visualize.visualize(cfg, params, _window(dape_run, QUERY + 1)[0], query=QUERY, layer=0,
                            head=2, output_dir=str(tmp_path), label='dape', train_length=16)
  for png in (doc['bias_png'], doc['attention_png']):
    assert open(png, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
  saved = json.load(open(os.path.join(tmp_path, 'visualize.json')))
  assert saved['distance'] == list(range(QUERY, -1, -1))
  static, adapted = np.asarray(saved['static_bias']), np.asarray(saved['adapted_bias'])
  chex.assert_shape([static, adapted], (cfg.num_heads, QUERY + 1))
  # Kerple's static bias: 0 at distance 0 and never positive, in every head (the arithmetic
  # task restarts positions at each document, so it is not monotone over the window).
  np.testing.assert_allclose(static[:, -1], 0, atol=1e-6)
  assert np.all(static <= 1e-6) and np.any(static < -1e-3)
  assert np.abs(adapted - static).max() > 1e-3  # DAPE changed it
  np.testing.assert_allclose(sum(saved['attention_row']), 1.0, rtol=1e-5)
  assert len(saved['window_tokens']) == QUERY + 1


def test_rope_has_no_bias_and_bad_arguments_are_clear(tmp_path):
  path = str(tmp_path / 'rope')
  run_fixtures._write_workdir(path, 'rope')  # pylint: disable=protected-access
  doc = visualize.visualize_run(path, query=QUERY, output_dir=str(tmp_path / 'out'))
  assert doc['static_bias'] is None and doc['adapted_bias'] is None
  assert doc['layer'] == 1  # the last layer by default
  assert visualize.default_query(64) == 1023
  with pytest.raises(ValueError, match='--head=9'):
    visualize.visualize_run(path, query=QUERY, head=9, output_dir=str(tmp_path / 'x'))
  with pytest.raises(ValueError, match='--layer=5'):
    visualize.visualize_run(path, query=QUERY, layer=5, output_dir=str(tmp_path / 'x'))
