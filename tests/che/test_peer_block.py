"""The benchmark's encoder block (`--architecture=peer`, bipe_jax/che/peer.py) against a NumPy
loop written from the benchmark's formulas (Ruoss et al. 2023, models/transformer.py) at the same
weights: embeddings x sqrt(D) (+ absolute positions), per layer a = LN(h + attn(h)),
h = LN(a + W2 relu(W1 a + b1) + b2), a biased head; with RoPE / two-sided ALiBi / a learned
table from the positions. Dropout is on with a key (training) and off in scoring."""

import math

import jax
import numpy as np
import pytest

from bipe_jax.che import batches
from bipe_jax.che import model as che_model
from bipe_jax.che import peer
from bipe_jax.che import scoring
from bipe_jax.che import training
from bipe_jax.tasks import che as tasks

TINY = dict(num_layers=2, hidden_size=16, num_heads=2)


def _peer(task, encoding):
  cfg = che_model.che_model_config(task, encoding, max_tokens=32, **TINY)
  module = che_model.build_module(cfg, task, 'peer')
  params = jax.tree.map(np.asarray, che_model.init_params(module, 0))
  # Non-trivial norms and biases, so the reference checks where each one sits.
  rng = np.random.default_rng(1)
  for i in range(TINY['num_layers']):
    layer = params[f'layer_{i}']
    for name in ('attention_norm', 'mlp_norm', 'mlp_in', 'mlp_out'):
      for leaf in ('scale', 'bias'):
        if leaf in layer[name]:
          layer[name][leaf] = (layer[name][leaf] + 0.3 * rng.normal(size=layer[name][leaf].shape)
                               ).astype(np.float32)
  params['head']['bias'] = rng.normal(size=params['head']['bias'].shape).astype(np.float32)
  return cfg, module, params


def _layer_norm(x, p):
  mean = x.mean()
  var = ((x - mean) ** 2).mean()
  return (x - mean) / math.sqrt(var + 1e-5) * p['scale'] + p['bias']


def _rotate(x, pos, dh):
  """RoPE (rotate-half layout, base 10000) of one head vector at position `pos`."""
  inv = 10000.0 ** (-np.arange(0, dh, 2) / dh)
  ang = np.concatenate([pos * inv, pos * inv])
  half = np.concatenate([-x[dh // 2:], x[:dh // 2]])
  return x * np.cos(ang) + half * np.sin(ang)


def _reference(params, batch, encoding, num_heads):
  """Logits [N, T, C] of the benchmark's encoder, one row, head, query and key at a time."""
  emb = params['embed']['embedding']
  d = emb.shape[1]
  dh = d // num_heads
  slopes = [2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)]
  out = []
  for r in range(batch['tokens'].shape[0]):
    pos, valid = batch['token'][r], batch['valid'][r]
    t = len(pos)
    h = np.stack([emb[batch['tokens'][r, i]] * math.sqrt(d) for i in range(t)])
    if encoding == 'learned':
      table = params['abs_embed']['embedding']
      h = h + np.stack([table[min(pos[i], len(table) - 1)] for i in range(t)])
    for layer_index in range(TINY['num_layers']):
      lp = params[f'layer_{layer_index}']
      att = lp['attention']
      attn_out = np.zeros((t, d))
      for head in range(num_heads):
        q = [h[i] @ att['query']['kernel'][:, head] for i in range(t)]
        k = [h[j] @ att['key']['kernel'][:, head] for j in range(t)]
        v = [h[j] @ att['value']['kernel'][:, head] for j in range(t)]
        if encoding == 'rope':
          q = [_rotate(q[i], pos[i], dh) for i in range(t)]
          k = [_rotate(k[j], pos[j], dh) for j in range(t)]
        for i in range(t):
          logits = []
          for j in range(t):
            s = float(q[i] @ k[j]) / math.sqrt(dh)
            if encoding == 'alibi':  # two-sided: the right side half a position further
              s -= slopes[head] * (pos[i] - pos[j] if pos[j] <= pos[i] else
                                   pos[j] - pos[i] + 0.5)
            logits.append(s if valid[j] else -np.inf)
          w = np.exp(np.array(logits) - max(logits))
          w /= w.sum()
          mixed = sum(w[j] * v[j] for j in range(t))
          attn_out[i] += mixed @ att['out']['kernel'][head]
      a = np.stack([_layer_norm(h[i] + attn_out[i], lp['attention_norm']) for i in range(t)])
      h = []
      for i in range(t):
        hidden = np.maximum(a[i] @ lp['mlp_in']['kernel'] + lp['mlp_in']['bias'], 0)
        m = hidden @ lp['mlp_out']['kernel'] + lp['mlp_out']['bias']
        h.append(_layer_norm(a[i] + m, lp['mlp_norm']))
      h = np.stack(h)
    out.append(h @ params['head']['kernel'] + params['head']['bias'])
  return np.stack(out)


def _batch(task):
  rows = [task.sample(np.random.default_rng(n), 1, n) for n in (2, 3)]
  return batches.pack(task, rows, 'task', pad_to=9, out_pad=4)  # row 1: 6 tokens, 3 padding


@pytest.mark.parametrize('encoding', ['rope', 'alibi', 'learned'])
def test_peer_block_matches_the_benchmark_formulas(encoding):
  task = tasks.get_task('reverse_string')
  cfg, module, params = _peer(task, encoding)
  assert cfg.ffn_size == 4 * cfg.hidden_size
  batch = _batch(task)
  got = np.asarray(jax.jit(lambda p, b: che_model.output_logits(module, p, b, task.output_size))(
      params, batch))
  want = _reference(params, batch, encoding, TINY['num_heads'])
  want = np.take_along_axis(want, batch['out_index'][:, :, None], axis=1)
  valid = batch['out_valid']
  np.testing.assert_allclose(got[valid], want[valid], rtol=1e-5, atol=1e-5)


def test_peer_init_is_haikus_default():
  """Linear kernels truncated at 2 std of 1/sqrt(fan_in) (the attention projections re-drawn),
  zero biases, LayerNorm scale 1 and offset 0, token embeddings of std 0.02."""
  task = tasks.get_task('reverse_string')
  cfg = che_model.che_model_config(task, 'rope', max_tokens=32, num_layers=1, hidden_size=64,
                                   num_heads=8)
  params = che_model.init_params(che_model.build_module(cfg, task, 'peer'), 3)
  layer = params['layer_0']
  kernels = dict(query=(layer['attention']['query']['kernel'], 64),
                 out=(layer['attention']['out']['kernel'], 64),
                 mlp_in=(layer['mlp_in']['kernel'], 64), mlp_out=(layer['mlp_out']['kernel'], 256),
                 head=(params['head']['kernel'], 64))
  for name, (w, fan_in) in kernels.items():
    w, std = np.asarray(w), 1 / math.sqrt(fan_in)
    assert np.abs(w).max() <= 2 * std + 1e-6, name
    assert 0.8 * std < w.std() < 0.95 * std, (name, w.std(), std)  # truncated: 0.88 std
  for leaf in (layer['mlp_in']['bias'], params['head']['bias'], layer['mlp_norm']['bias']):
    np.testing.assert_array_equal(leaf, 0)
  np.testing.assert_array_equal(layer['attention_norm']['scale'], 1)
  assert 0.015 < float(np.std(params['embed']['embedding'])) < 0.02


def test_dropout_is_on_in_training_and_off_in_scoring():
  task = tasks.get_task('reverse_string')
  _, module, params = _peer(task, 'rope')
  batch = _batch(task)
  jitted = jax.jit(che_model.output_logits, static_argnums=(0, 3))
  logits = lambda key: np.asarray(jitted(module, params, batch, task.output_size, key))
  plain, k1, k2 = logits(None), jax.random.PRNGKey(1), jax.random.PRNGKey(2)
  assert not np.allclose(logits(k1), plain, atol=1e-3)
  assert not np.allclose(logits(k1), logits(k2), atol=1e-3)
  np.testing.assert_array_equal(logits(k1), logits(k1))
  # The training loss draws dropout from each step's key; the project's block has none.
  jitted_loss = jax.jit(training.batch_loss, static_argnums=(0, 3))
  loss = lambda m, p, key: float(jitted_loss(m, p, batch, task.output_size, key))
  assert loss(module, params, k1) != loss(module, params, k2)
  assert loss(module, params, None) == pytest.approx(loss(module, params, None))
  project = che_model.build_module(module.config, task, 'project')
  project_params = che_model.init_params(project, 0)
  assert loss(project, project_params, k1) == pytest.approx(loss(project, project_params, k2),
                                                            abs=1e-7)
  # Scoring predicts without dropout, whatever its key.
  predict = scoring._predict(module, task.output_size)  # pylint: disable=protected-access
  for key in (k1, k2):
    np.testing.assert_array_equal(np.asarray(predict(params, batch, key)), plain.argmax(-1))


def test_unknown_architecture_is_refused_in_one_line():
  with pytest.raises(ValueError, match="--architecture='post_ln' must be one of project, peer"):
    che_model.check_architecture('post_ln')
  assert isinstance(che_model.build_module(
      che_model.che_model_config(tasks.get_task('parity_check'), 'nope', max_tokens=16, **TINY),
      tasks.get_task('parity_check'), 'peer'), peer.PeerEncoder)


def test_a_grid_records_its_block_and_refuses_to_mix_blocks(tmp_path, monkeypatch):
  """Each cell records `architecture`; a finished cell of another block (a cell written before
  the option counts as 'project') stops the run with one line."""
  import json  # pylint: disable=g-import-not-at-top
  from bipe_jax.che import cell  # pylint: disable=g-import-not-at-top
  from bipe_jax.che import sweep  # pylint: disable=g-import-not-at-top
  seen = []

  def fake_cell(task_name, encoding, seed, budget, plan, *, segmentation, progress, **settings):
    seen.append(settings['architecture'])
    import dataclasses  # pylint: disable=g-import-not-at-top
    return dict(task=task_name, level='regular', encoding=encoding, seed=seed,
                segmentation=cell.segmentation_of(encoding, segmentation), score=0.5,
                in_distribution=1.0, scored_lengths='x', accuracy={'41': 0.5},
                budget=dataclasses.asdict(budget), eval=dataclasses.asdict(plan),
                architecture=settings['architecture'])

  monkeypatch.setattr(cell, 'run_cell', fake_cell)
  budget, plan, out = training.Budget(steps=3), cell.EvalPlan(lengths='41'), str(tmp_path)
  run = lambda arch: sweep.run_grid(['parity_check'], ['rope'], [0], budget, plan, out,
                                    say=lambda _: None, architecture=arch)
  assert run('peer')['cells'][0]['architecture'] == 'peer' and seen == ['peer']
  with pytest.raises(ValueError, match="this finished cell has .*'architecture': 'peer'"):
    run('project')
  path = sweep.cell_path(out, 'parity_check', 'rope', 0)
  with open(path) as f:
    old = json.load(f)
  del old['architecture']  # a cell of the grid before the option
  with open(path, 'w') as f:
    json.dump(old, f)
  assert len(run('project')['cells']) == 1 and seen == ['peer']  # resumed, nothing trained
