"""CHE training / scoring (bipe_jax/che): segments against a loop reference, the encoder's
inputs, padding that changes no logit and no score, every encoding running, the loss, and the
resumable grid."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import model as model_lib
from bipe_jax import schemes
from bipe_jax.che import batches
from bipe_jax.che import cell
from bipe_jax.che import flags as che_flags
from bipe_jax.che import model as che_model
from bipe_jax.che import scoring
from bipe_jax.che import segments
from bipe_jax.che import sweep
from bipe_jax.che import training
from bipe_jax.tasks import che as tasks

TINY = dict(num_layers=1, hidden_size=16, num_heads=2)


def _streams_loop(ends):
  intra, inter, i, s = [], [], 0, 0
  for e in ends:
    intra.append(i)
    inter.append(s)
    i, s = (0, s + 1) if e else (i + 1, s)
  return intra, inter


def test_segments_against_loop_and_by_hand():
  tokens = np.array([1, 0, 2, 1, 1, 3, 3, 3])  # binary addition '10+11', 3 placeholders
  ends = segments.segment_ends(tokens, 5, (2,), 'task')
  np.testing.assert_array_equal(ends, [0, 0, 1, 0, 1, 0, 0, 0])
  intra, inter = segments.streams(ends)
  np.testing.assert_array_equal(intra, [0, 1, 2, 0, 1, 0, 1, 2])
  np.testing.assert_array_equal(inter, [0, 0, 0, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(segments.segment_ends(tokens, 5, (2,), 'none'), [0] * 8)
  np.testing.assert_array_equal(segments.segment_ends(tokens, 5, (2,), 'fixed:3'),
                                [0, 0, 1, 0, 0, 1, 0, 0])
  rng = np.random.default_rng(0)
  for _ in range(20):
    ends = rng.random(int(rng.integers(1, 30))) < 0.3
    np.testing.assert_array_equal(segments.streams(ends), _streams_loop(ends))
  for bad in ('fixed:0', 'fixed:x', 'sentences'):
    with pytest.raises(ValueError, match='segmentation='):
      segments.parse(bad)


def test_pack_reads_outputs_at_the_placeholders():
  task = tasks.get_task('reverse_string')
  b = tasks.Batch(np.array([[1, 0, 0]]), np.array([[0, 0, 1]]), np.ones((1, 3), bool))
  p = batches.pack(task, [b], 'task', pad_to=8, out_pad=4)
  np.testing.assert_array_equal(p['tokens'][0], [1, 0, 0, 2, 2, 2, 0, 0])  # placeholder = 2
  np.testing.assert_array_equal(p['valid'][0], [1, 1, 1, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(p['out_index'][0], [3, 4, 5, 0])
  np.testing.assert_array_equal(p['out_valid'][0], [1, 1, 1, 0])
  np.testing.assert_array_equal(p['inter'][0], [0, 0, 0, 1, 1, 1, 0, 0])
  with pytest.raises(ValueError, match='does not fit'):
    batches.pack(task, [b], 'task', pad_to=5, out_pad=4)


def _tiny(task, encoding, max_tokens=256):
  cfg = che_model.che_model_config(task, encoding, max_tokens=max_tokens, **TINY)
  module = model_lib.Transformer(cfg)
  return module, che_model.init_params(module, 0)


@pytest.mark.parametrize('encoding', ['rope', 'kerple', 'dape_kerple', 'bipe_rope'])
def test_padding_and_mixed_lengths_change_no_logit(encoding):
  task = tasks.get_task('binary_addition')
  module, params = _tiny(task, encoding)
  rows = [task.sample(np.random.default_rng(n), 2, n) for n in (3, 9)]
  f = jax.jit(lambda p, b: che_model.output_logits(module, p, b, task.output_size))
  for b in rows:
    n_tok, n_out = b.inputs.shape[1] + b.targets.shape[1], b.targets.shape[1]
    exact = f(params, batches.pack(task, [b], 'task', n_tok, n_out))
    padded = f(params, batches.pack(task, rows, 'task', 64, 32))  # both lengths, one shape
    at = 0 if b is rows[0] else 2
    np.testing.assert_allclose(padded[at:at + 2, :n_out], exact, rtol=1e-5, atol=1e-5)


def test_bucketed_scores_equal_unbucketed():
  task = tasks.get_task('missing_duplicate_string')
  module, params = _tiny(task, 'alibi')
  kw = dict(samples=6, seed=3, segmentation='task')
  lengths = (1, 2, 7, 12, 45)
  exact = scoring.per_length_accuracy(task, module, params, lengths, bucket=1,
                                      rows_per_call=6, **kw)
  bucketed = scoring.per_length_accuracy(task, module, params, lengths, bucket=64,
                                         rows_per_call=4, **kw)
  assert exact == bucketed and set(exact) == set(lengths)


def test_score_lengths_and_their_description():
  acc = {40: 1.0, 41: 0.5, 500: 0.0, 501: 1.0}
  assert scoring.score(acc) == 0.25 and scoring.mean_over(acc, 1, 40) == 1.0
  assert scoring.parse_lengths('1-5:2,4,10-12') == (1, 3, 4, 5, 10, 11, 12)
  with pytest.raises(ValueError, match="'5-1'"):
    scoring.parse_lengths('5-1')
  assert scoring.describe(range(41, 501)) == 'every length 41..500'
  assert scoring.describe([41, 100]) == '2 of the 460 lengths 41..500 (41..100)'


def test_accuracy_counts_only_the_masked_outputs():
  """An untrained model's per-length accuracy equals a direct count over the outputs up to the
  terminator (binary addition), from the same rows."""
  task = tasks.get_task('binary_addition')
  module, params = _tiny(task, 'rope')
  acc = scoring.per_length_accuracy(task, module, params, (5,), samples=4, seed=1,
                                    segmentation='task', bucket=1, rows_per_call=4)
  b = task.sample(np.random.default_rng([1, 5]), 4, 5)
  p = batches.pack(task, [b], 'task', 11, 6)
  pred = np.argmax(che_model.output_logits(module, params, p, task.output_size), -1)
  counted = [(pred[r, o] == b.targets[r, o]) for r in range(4) for o in range(6)
             if o <= list(b.targets[r]).index(2)]
  assert acc[5] == pytest.approx(np.mean(counted))


def test_cross_entropy_against_numpy():
  rng = np.random.default_rng(0)
  logits, targets = rng.normal(size=(2, 3, 4)), rng.integers(0, 4, size=(2, 3))
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  want = -np.mean([logp[b, o, targets[b, o]] for b in range(2) for o in range(3) if mask[b, o]])
  got = training.cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


CHE_REFUSED = {'dapev2_kerple'}  # DAPE V2's convolution over keys is causal-only


@pytest.mark.parametrize('encoding', sorted(set(schemes.SCHEME_NAMES) - CHE_REFUSED))
def test_every_encoding_runs(encoding):
  task = tasks.get_task('solve_equation')
  module, params = _tiny(task, encoding)
  b = batches.pack(task, [task.sample(np.random.default_rng(0), 2, 9)], 'task', 16, 1)
  logits = jax.jit(lambda p, x: che_model.output_logits(module, p, x, task.output_size))(params, b)
  assert logits.shape == (2, 1, 5) and bool(jnp.all(jnp.isfinite(logits)))


def test_cope_vectors_cover_the_longest_training_row():
  task = tasks.get_task('reverse_string')
  cfg = che_model.che_model_config(task, 'cope', max_tokens=1200)
  assert cfg.cope_positions == batches.row_length(task, che_model.TRAIN_MAX_LENGTH) + 1 == 81
  assert cfg.max_position >= 1200  # the other tables still cover every scored row


def test_refused_encoding_says_why():
  with pytest.raises(ValueError, match='model.causal=False'):
    che_model.che_model_config(tasks.get_task('parity_check'), 'dapev2_kerple', max_tokens=64)


def _fake_cell(calls):
  def run_cell(task_name, encoding, seed, budget, plan, segmentation, progress, **settings):
    calls.append((task_name, encoding, seed))
    import dataclasses
    return dict(task=task_name, level='regular', encoding=encoding, seed=seed,
                segmentation=cell.segmentation_of(encoding, segmentation),
                score=0.1 * (seed + 1), in_distribution=1.0, scored_lengths='x',
                accuracy={'1': 1.0, '41': 0.1 * (seed + 1)},
                budget=dataclasses.asdict(budget), eval=dataclasses.asdict(plan), **settings)
  return run_cell


def test_grid_is_incremental_and_resumable(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(cell, 'run_cell', _fake_cell(calls))
  budget, plan = training.Budget(steps=3), cell.EvalPlan(lengths='1,41')
  out = str(tmp_path)
  summary = sweep.run_grid(['parity_check'], ['rope', 'bipe_rope'], [0, 1], budget, plan, out,
                           say=lambda _: None)
  assert len(calls) == 4 and len(summary['cells']) == 4
  assert '| parity_check | regular | 15.0 ± 5.0 (2) | 15.0 ± 5.0 (2) |' in summary['table']
  assert os.path.exists(os.path.join(out, 'parity_check.png'))
  os.remove(sweep.cell_path(out, 'parity_check', 'rope', 1))
  sweep.run_grid(['parity_check'], ['rope', 'bipe_rope'], [0, 1], budget, plan, out,
                 say=lambda _: None)
  assert calls[4:] == [('parity_check', 'rope', 1)]  # only the missing cell ran
  with open(os.path.join(out, 'results.json')) as f:
    assert len(json.load(f)['cells']) == 4
  with pytest.raises(ValueError, match='this finished cell has'):
    sweep.run_grid(['parity_check'], ['rope'], [0], training.Budget(steps=4), plan, out,
                   say=lambda _: None)


def test_shards_split_the_pairs_and_a_last_run_assembles(tmp_path, monkeypatch):
  """Two shards run disjoint (task, encoding) pairs, each pair's seeds in a row, and write
  cells only; the run without a shard then trains nothing and writes the summary."""
  calls = []
  monkeypatch.setattr(cell, 'run_cell', _fake_cell(calls))
  budget, plan = training.Budget(steps=3), cell.EvalPlan(lengths='1,41')
  out, grid = str(tmp_path), (['parity_check', 'reverse_string'], ['rope', 'alibi', 'nope'])
  for i in (0, 1):
    sweep.run_grid(*grid, [0, 1], budget, plan, out, say=lambda _: None, shard=(i, 2))
    assert not os.path.exists(os.path.join(out, 'results.json'))
    if i == 0:  # half the grid finished: assembling trains nothing and tables what exists
      said = []
      partial = sweep.run_grid(*grid, [0, 1], budget, plan, out, say=said.append,
                               train_missing=False)
      assert len(calls) == 6 and len(partial['cells']) == 6
      assert said == ['6 of 12 cells not finished yet (not trained: assembling only)']
      assert '| reverse_string | regular | - | 15.0 ± 5.0 (2) | - |' in partial['table']
      os.remove(os.path.join(out, 'results.json'))
  assert calls[:2] == [('parity_check', 'rope', 0), ('parity_check', 'rope', 1)]
  assert sorted(calls) == sorted((t, e, s) for t in grid[0] for e in grid[1] for s in (0, 1))
  assert {c[:2] for c in calls[:6]} == {('parity_check', 'rope'), ('parity_check', 'nope'),
                                        ('reverse_string', 'alibi')}
  summary = sweep.run_grid(*grid, [0, 1], budget, plan, out, say=lambda _: None)
  assert len(calls) == 12 and len(summary['cells']) == 12
  assert os.path.exists(os.path.join(out, 'results.json'))
  for bad in ('2/2', '1', 'a/b', '-1/3'):
    with pytest.raises(ValueError, match='--shard'):
      che_flags.parse_shard(bad)
  assert che_flags.parse_shard('') is None and che_flags.parse_shard('1/4') == (1, 4)


def test_a_queue_gives_each_pair_to_one_process_and_a_last_run_finishes_a_dead_claim(
    tmp_path, monkeypatch):
  """Processes sharing a queue_dir train every cell exactly once between them, each pair's seeds
  in one process; a pair claimed by a process that died is left alone by the others, and the
  assembling run (no queue) trains its cells."""
  import threading  # pylint: disable=g-import-not-at-top
  calls, lock = [], threading.Lock()
  fake = _fake_cell(calls)

  def slow_cell(*args, **kwargs):  # long enough for the workers to interleave
    with lock:
      result = fake(*args, **kwargs)
    threading.Event().wait(0.01)
    result['worker'] = threading.current_thread().name
    return result

  monkeypatch.setattr(cell, 'run_cell', slow_cell)
  budget, plan = training.Budget(steps=3), cell.EvalPlan(lengths='1,41')
  out, queue = str(tmp_path / 'grid'), str(tmp_path / 'queue')
  grid = (['parity_check', 'reverse_string'], ['rope', 'alibi', 'nope'])
  os.makedirs(os.path.join(queue, 'reverse_string__nope'))  # held by a process that died
  workers = [threading.Thread(target=sweep.run_grid, name=f'w{i}',
                              args=(*grid, [0, 1], budget, plan, out),
                              kwargs=dict(say=lambda _: None, queue_dir=queue))
             for i in range(3)]
  for w in workers:
    w.start()
  for w in workers:
    w.join()
  assert not os.path.exists(os.path.join(out, 'results.json'))  # workers write cells only
  want = sorted((t, e, s) for t in grid[0] for e in grid[1] for s in (0, 1))
  assert sorted(calls) == [c for c in want if c[:2] != ('reverse_string', 'nope')]
  by_pair = {}
  for t, e, s in calls:
    with open(sweep.cell_path(out, t, e, s)) as f:
      by_pair.setdefault((t, e), set()).add(json.load(f)['worker'])
  assert all(len(w) == 1 for w in by_pair.values())  # a pair's seeds ran in one process
  assert sorted(os.listdir(queue)) == sorted(f'{t}__{e}' for t in grid[0] for e in grid[1])
  summary = sweep.run_grid(*grid, [0, 1], budget, plan, out, say=lambda _: None)
  assert sorted(calls) == want and len(summary['cells']) == 12
  with pytest.raises(ValueError, match='--shard and --queue_dir'):
    sweep.run_grid(*grid, [0], budget, plan, out, shard=(0, 2), queue_dir=queue)


def test_cells_of_one_model_reuse_the_compiled_step_and_predictor():
  """Seeds of one (task, encoding) build equal modules: the jitted functions are shared, so the
  next seed compiles nothing (bipe_jax/che/training.py, scoring.py)."""
  task = tasks.get_task('parity_check')
  make = lambda: model_lib.Transformer(che_model.che_model_config(task, 'rope', max_tokens=64))
  assert training.train_step(make(), 2, 1e-3) is training.train_step(make(), 2, 1e-3)
  assert training.train_step(make(), 2, 1e-3) is not training.train_step(make(), 2, 3e-3)
  predict = scoring._predict  # pylint: disable=protected-access
  assert predict(make(), 2) is predict(make(), 2)


@pytest.mark.slow
def test_one_cell_end_to_end_learns_in_distribution(tmp_path):
  """A small encoder learns parity of lengths 1..2 (6 strings; chance 0.5) with the curriculum
  loop, and is scored at the lengths asked for."""
  budget = training.Budget(steps=150, batch_size=32, learning_rate=3e-3, max_length=2)
  result = cell.run_cell('parity_check', 'rope', 0, budget,
                         cell.EvalPlan(lengths='1-2,41', samples=32, bucket=64),
                         model_overrides=dict(num_layers=2, hidden_size=32, num_heads=4))
  assert result['in_distribution'] > 0.95, result
  assert result['final_loss'] < 0.2, result
  assert set(result['accuracy']) == {'1', '2', '41'}


@pytest.mark.parametrize('script', ['eval/che.py', 'eval/che_sweep.py'])
def test_help_lists_every_flag_its_usage_line_uses(script):
  """`--help` lists the flags the CHE programs share (bipe_jax/che/flags.py: --seeds, --steps,
  --output_dir, ...), not only the script's own: every --flag of the docstring's usage lines
  and every shared flag is in it."""
  import re  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from tests import fixtures  # pylint: disable=g-import-not-at-top
  from tests import forkserver  # pylint: disable=g-import-not-at-top
  proc = forkserver.run([sys.executable, script, '--help'], cwd=fixtures.ROOT,
                        env=fixtures.cpu_env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  listed = set(re.findall(r'^\s+--(?:\[no\])?(\w+):', proc.stdout, re.M))
  with open(os.path.join(fixtures.ROOT, script), encoding='utf-8') as f:
    usage = f.read().split('"""')[1]
  used = set(re.findall(r'--(\w+)=', usage))
  shared = {'seeds', 'steps', 'output_dir', 'eval_lengths', 'batch_size', 'shard', 'queue_dir'}
  assert used and used <= listed, sorted(used - listed)
  assert shared <= listed, sorted(shared - listed)
