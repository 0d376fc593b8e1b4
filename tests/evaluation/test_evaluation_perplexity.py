"""Perplexity library: summed NLL over masked blocks equals a hand-written loop; table, JSON, plot."""

import json
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from bipe_jax.evaluation import perplexity as ppl
from bipe_jax.evaluation import plot
from tests import reference_numpy
from tests import fixtures

ROOT = fixtures.ROOT

V = 11


class _CausalStandIn(nn.Module):
  """Small causal LM (embedding, causal running mean, dense) standing in for the Transformer."""

  @nn.compact
  def __call__(self, tokens_BxT):
    x = nn.Embed(V, 8)(tokens_BxT)
    x = jnp.cumsum(x, axis=1) / jnp.arange(1, x.shape[1] + 1)[None, :, None]
    return nn.Dense(V)(jnp.tanh(nn.Dense(16)(x)))


def _model():
  model = _CausalStandIn()
  params = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))['params']
  return lambda p, t: model.apply({'params': p}, t), params


def _loop_reference(apply_fn, params, tokens, mask):
  """Block by block, token by token, in float64 NumPy."""
  forward = jax.jit(apply_fn)
  return reference_numpy.block_nll_loop(lambda p, x: forward(p, jnp.asarray(x)), params, tokens,
                                        mask)


@pytest.mark.parametrize('batch_size', [1, 3, 16])
@pytest.mark.parametrize('sliding', [False, True])
def test_score_blocks_equals_hand_loop(batch_size, sliding):
  apply_fn, params = _model()
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, V, size=(7, 12)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  mask[:, 0] = False
  if sliding:  # only the last 4 targets of each window are scored
    mask[:, :-4] = False
  done = []
  res = ppl.score_blocks(apply_fn, params, tokens, mask, batch_size=batch_size,
                         progress=done.append)
  ref_nll, ref_count = _loop_reference(apply_fn, params, tokens, mask)
  assert res.tokens == ref_count == (7 * 4 if sliding else 7 * 11)
  assert res.blocks == 7 and res.length == 12
  np.testing.assert_allclose(res.nll_sum, ref_nll, rtol=1e-5)
  np.testing.assert_allclose(res.perplexity, math.exp(ref_nll / ref_count), rtol=1e-5)
  assert done[-1] == 7


def test_column_zero_of_the_mask_is_ignored():
  apply_fn, params = _model()
  tokens = np.arange(20, dtype=np.int32).reshape(2, 10) % V
  mask = np.ones_like(tokens, bool)
  a = ppl.score_blocks(apply_fn, params, tokens, mask)
  mask[:, 0] = False
  b = ppl.score_blocks(apply_fn, params, tokens, mask)
  assert a.tokens == b.tokens == 18 and a.nll_sum == b.nll_sum


def test_score_blocks_on_a_mesh_matches_no_mesh():
  apply_fn, params = _model()
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, V, size=(5, 9)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ('data', 'fsdp', 'tensor'))
  a = ppl.score_blocks(apply_fn, params, tokens, mask, batch_size=2, mesh=mesh)
  b = ppl.score_blocks(apply_fn, params, tokens, mask, batch_size=5)
  assert a.tokens == b.tokens
  np.testing.assert_allclose(a.nll_sum, b.nll_sum, rtol=1e-6)


def test_block_nll_hand_example():
  # uniform logits over 4 classes: every target costs log 4
  logits = jnp.zeros((1, 3, 4))
  nll, count = ppl.block_nll(logits, jnp.array([[0, 1, 2]]), jnp.array([[False, True, True]]))
  assert int(count) == 2
  np.testing.assert_allclose(float(nll), 2 * math.log(4), rtol=1e-6)


def test_bad_shapes_and_empty_blocks():
  apply_fn, params = _model()
  with pytest.raises(ValueError, match='same'):
    ppl.score_blocks(apply_fn, params, np.zeros((2, 4), np.int32), np.ones((2, 5), bool))
  with pytest.raises(ValueError, match='no blocks'):
    ppl.score_blocks(apply_fn, params, np.zeros((0, 4), np.int32), np.ones((0, 4), bool))


def test_tables_and_json_round_trip(tmp_path):
  r1 = [ppl.LengthResult(64, 10, 630, 630 * 2.0), ppl.LengthResult(128, 5, 635, 635 * 2.5)]
  r2 = [ppl.LengthResult(64, 10, 630, 630 * 1.0)]
  one = ppl.format_table({'rope': r1})
  assert 'perplexity' in one and f'{math.exp(2.5):.3f}' in one and '635' in one
  side = ppl.format_table({'rope': r1, 'bipe_rope': r2})
  assert 'rope' in side and 'bipe_rope' in side and f'{math.e:.3f}' in side
  md = ppl.format_markdown({'rope': r1, 'bipe_rope': r2})
  assert md.splitlines()[0] == '| length | tokens scored | rope | bipe_rope |'
  assert f'{math.exp(2.0):.2f}' in md and '| 128 | 635 |' in md
  path = tmp_path / 'r.json'
  path.write_text(json.dumps([r.to_dict() for r in r1]))
  back = json.loads(path.read_text())
  assert back[1]['perplexity'] == pytest.approx(math.exp(2.5))


def test_plot_writes_png(tmp_path):
  out = tmp_path / 'sub' / 'ppl.png'
  plot.plot_perplexity({'rope': ([64, 128, 256], [10.0, 30.0, 200.0]),
                        'bipe_rope': ([64, 128, 256], [11.0, 14.0, 20.0])}, str(out),
                       train_length=64)
  data = out.read_bytes()
  assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 5000
  with pytest.raises(ValueError, match='no runs'):
    plot.plot_perplexity({}, str(out))


def test_perplexity_tick_labels_keep_the_digits_a_narrow_range_needs(tmp_path):
  narrow = plot.number_formatter([814.2, 815.4])
  labels = [narrow(v) for v in (814.4, 814.8, 815.2)]
  assert labels == ['814.40', '814.80', '815.20']  # not 814, 815, 815
  wide = plot.number_formatter([10.0, 3000.0])
  assert [wide(v) for v in (10.0, 200.0, 3000.0)] == ['10.0', '200', '3,000']
  path = plot.plot_perplexity({'run': ([64, 128], [814.2, 815.4])}, str(tmp_path / 'p.png'))
  assert os.path.getsize(path) > 0


def test_results_go_into_the_workdir_by_default(tmp_path):
  from bipe_jax.evaluation import cli as eval_cli  # pylint: disable=g-import-not-at-top
  runs_ = [str(tmp_path / 'a'), str(tmp_path / 'b')]
  assert eval_cli.resolve_output('auto', runs_, 'perplexity.json') == os.path.join(
      runs_[0], 'perplexity.json')
  assert eval_cli.resolve_output('', runs_, 'passkey.json') == ''  # none asked for
  assert eval_cli.resolve_output('x.json', runs_, 'passkey.json') == 'x.json'
  for script, name in (('perplexity.py', 'perplexity.json'), ('passkey.py', 'passkey.json')):
    with open(os.path.join(ROOT, 'eval', script), encoding='utf-8') as f:
      assert "'output', 'auto'" in f.read(), script  # the CLIs' default is the workdir's file
