"""Evaluation of a training workdir: restore, blockwise == dense, CLI == hand loop, clear errors.

The workdir is written here the way train/main.py writes it (config.json + an Orbax checkpoint
through bipe_jax.state.checkpointing), with random (not freshly initialised) parameters so
logits are far from uniform, on the arithmetic task (vocab 19, nothing to download or build).
"""

import json
import math
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import data
from bipe_jax import model as model_lib
from bipe_jax.evaluation import cli
from bipe_jax.evaluation import perplexity as ppl
from bipe_jax.runs import restore as runs_lib
from bipe_jax.evaluation import sweep
from bipe_jax.state import checkpointing
from bipe_jax.training import resolve as resolve_lib
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer as optimizer_lib
from bipe_jax.state import train_state as train_state_lib
from configs import arithmetic_tiny
from tests import reference_numpy
from tests.fixtures import cpu_env
from tests import fixtures
from tests import forkserver

ROOT = fixtures.ROOT


def _config(encoding):
  config = arithmetic_tiny.get_config(encoding)
  m = config.model
  m.hidden_size, m.num_layers, m.num_heads, m.ffn_size = 32, 2, 4, 64
  m.block_size = 8  # several key/query blocks at every evaluation length
  config.data.seq_len = 16
  config.data.arithmetic_train_max_ops = 2  # short problems: quick greedy decoding
  config.data.arithmetic_eval_max_ops = 3
  config.mesh.data = 1
  return resolve_lib.resolve(config, device_count=1,
                             tokenizer=data.get_tokenizer(config.data)).to_config_dict()


def _write_workdir(workdir, encoding, steps=(3,)):
  """config.json + one checkpoint of random parameters; returns the parameters."""
  config = _config(encoding)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(config.to_json_best_effort(indent=2))
  mesh = mesh_lib.make_mesh(config.mesh, devices=jax.devices()[:1])
  model = model_lib.Transformer(runs_lib._model_config(config, {}))
  tx = optimizer_lib.make_optimizer(config.train)
  state, _ = train_state_lib.create_train_state(model, tx, mesh, config.data.seq_len, seed=1)
  rng = np.random.default_rng(7)
  params = jax.tree.map(
      lambda x: ((1.0 if x.ndim == 1 else 0.0) + 0.4 * rng.standard_normal(x.shape)).astype(
          np.float32), jax.device_get(state.params))
  state = state.replace(params=jax.device_put(params, jax.tree.map(lambda x: x.sharding,
                                                                   state.params)))
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'), every_steps=1, keep=3,
                                    async_save=False)
  for step in steps:
    ckpt.save(step, state, {'note': 'test'}, force=True)
  ckpt.close()
  return config, params


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('runs') / 'bipe_rope')
  config, params = _write_workdir(path, 'bipe_rope')
  return path, config, params


def _hand_loop(config, params, tokens, mask):
  """Dense model, one block at a time, float64 NumPy log-softmax, token by token."""
  model = model_lib.Transformer(runs_lib._model_config(config, {'attention_impl': 'dense'}))
  forward = jax.jit(lambda p, x: model.apply({'params': p}, x))
  return reference_numpy.block_nll_loop(lambda p, x: forward(p, jnp.asarray(x)), params, tokens,
                                        mask)


def test_restored_params_equal_the_saved_ones(workdir):
  path, _, params = workdir
  run = runs_lib.load_run(path)
  assert run.step == 3 and run.encoding == 'bipe_rope' and run.train_length == 16
  assert run.model_config.attention_impl == 'blockwise'
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(run.params), params)


@pytest.mark.parametrize('encoding', ['bipe_rope', 'alibi'])
def test_blockwise_and_dense_evaluation_agree(tmp_path, encoding):
  path = str(tmp_path / encoding)
  config, _ = _write_workdir(path, encoding)
  results = {}
  for impl in ('blockwise', 'dense'):
    run = runs_lib.load_run(path, attention_impl=impl)
    assert run.model_config.attention_impl == impl
    results[impl] = sweep.evaluate_run(run, [20, 64], max_tokens=512, tokens_per_batch=128)
  for b, d in zip(results['blockwise'], results['dense']):
    assert b.tokens == d.tokens > 0
    np.testing.assert_allclose(b.nll_sum, d.nll_sum, rtol=1e-5)
  # random parameters: clearly not a uniform predictor over the 19 symbols
  assert abs(results['dense'][0].nll - math.log(19)) > 0.05


def test_library_sweep_equals_hand_loop(workdir):
  path, config, params = workdir
  run = runs_lib.load_run(path)
  res, = sweep.evaluate_run(run, [24], max_tokens=200, tokens_per_batch=48)
  tokens, mask = data.make_eval_blocks(config.data, 24, max_tokens=200)
  ref_nll, ref_count = _hand_loop(config, params, tokens, mask)
  assert res.tokens == ref_count == tokens.shape[0] * 23
  np.testing.assert_allclose(res.nll_sum, ref_nll, rtol=1e-5)


@pytest.mark.slow
def test_cli_json_and_png_equal_hand_loop(workdir, tmp_path):
  path, config, params = workdir
  out, png = str(tmp_path / 'r.json'), str(tmp_path / 'p.png')
  proc = forkserver.run(
      [sys.executable, os.path.join(ROOT, 'eval', 'perplexity.py'), f'--workdir={path}',
       '--lengths=16,40', '--max_tokens=300', f'--output={out}', f'--plot={png}',
       '--protocol=sliding', '--stride=8'],
      capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'perplexity' in proc.stdout and 'bipe_rope' in proc.stdout
  # quiet: no absl / Orbax INFO line on the terminal, only progress bars and results
  assert not re.search(r'^I\d{4} ', proc.stdout + proc.stderr, re.M), proc.stderr[-3000:]
  assert len(proc.stdout.strip().splitlines()) <= 8, proc.stdout
  doc = json.loads(open(out).read())
  assert doc['protocol'] == 'sliding' and doc['stride'] == 8
  entry, = doc['runs']
  assert entry['encoding'] == 'bipe_rope' and entry['step'] == 3
  for r in entry['results']:
    tokens, mask = data.make_eval_blocks(config.data, r['length'], max_tokens=300, stride=8)
    ref_nll, ref_count = _hand_loop(config, params, tokens, mask)
    assert r['tokens'] == ref_count
    np.testing.assert_allclose(r['nll_sum'], ref_nll, rtol=1e-5)
    np.testing.assert_allclose(r['perplexity'], math.exp(ref_nll / ref_count), rtol=1e-5)
    assert f'{r["perplexity"]:.3f}' in proc.stdout
  assert open(png, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def test_missing_empty_and_unfinished_workdirs_are_clear_errors(tmp_path, capsys):
  with pytest.raises(runs_lib.RunError, match='does not exist'):
    runs_lib.load_run(str(tmp_path / 'nope'))
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(runs_lib.RunError, match='is empty'):
    runs_lib.load_run(str(empty))
  (empty / 'metrics.jsonl').write_text('')
  with pytest.raises(runs_lib.RunError, match='no saved config'):
    runs_lib.load_run(str(empty))
  (empty / 'config.json').write_text(_config('rope').to_json_best_effort())
  with pytest.raises(runs_lib.RunError, match='no checkpoint'):
    runs_lib.load_run(str(empty))
  code = cli.perplexity_main(workdirs=[str(tmp_path / 'nope')], lengths='16', output='')
  assert code == 2
  err = capsys.readouterr().err
  assert err.startswith('error: workdir') and 'does not exist' in err


def test_cli_argument_errors(workdir, capsys):
  path = workdir[0]
  assert cli.perplexity_main(workdirs=[], lengths='16', output='') == 2
  assert cli.perplexity_main(workdirs=[path], lengths='16,abc', output='') == 2
  assert "'abc' is not an integer" in capsys.readouterr().err
  assert cli.perplexity_main(workdirs=[path], lengths='16', protocol='sliding', output='') == 2
  assert '--stride' in capsys.readouterr().err
  with pytest.raises(runs_lib.RunError, match='available steps'):
    runs_lib.load_run(path, step=99)


def test_corrupt_latest_checkpoint_falls_back_with_a_warning(tmp_path, capsys):
  path = str(tmp_path / 'w')
  _write_workdir(path, 'rope', steps=(3, 5))
  state_dir = os.path.join(path, 'checkpoints', '5', 'state')
  for name in os.listdir(state_dir):  # break the newest checkpoint's arrays
    full = os.path.join(state_dir, name)
    if os.path.isdir(full):
      for sub in os.listdir(full):
        os.remove(os.path.join(full, sub)) if os.path.isfile(os.path.join(full, sub)) else None
    else:
      os.remove(full)
  run = runs_lib.load_run(path)
  assert run.step == 3
  lines = capsys.readouterr().err.splitlines()  # one line per damaged step, one for the used
  assert len(lines) == 2, lines
  assert lines[0].startswith('WARNING: checkpoint step 5 in ') and 'is damaged' in lines[0]
  assert 'TensorStore' not in lines[0] and len(lines[0]) < 400
  assert lines[1] == 'using checkpoint step 3, the newest that restores'
  assert os.path.isdir(os.path.join(path, 'checkpoints', '5'))  # evaluation modifies nothing


def test_arithmetic_cli_reports_accuracy_by_length(workdir, tmp_path, capsys):
  path = workdir[0]
  out = str(tmp_path / 'arith.json')
  assert cli.arithmetic_main(workdirs=[path], per_length=3, batch_size=4, output=out) == 0
  doc = json.loads(open(out).read())
  entry, = doc['runs']
  assert [r['num_ops'] for r in entry['results']] == [1, 2, 3]
  assert entry['train_ops'] == [1, 2]
  for r in entry['results']:
    assert r['count'] == 3 and 0.0 <= r['accuracy'] <= 1.0
    assert r['chain_correct'] <= r['answer_correct']
  printed = capsys.readouterr().out
  assert '| 1 (train) |' in printed and '| 3 |' in printed


def test_arithmetic_cli_rejects_a_text_workdir(tmp_path, capsys):
  w = tmp_path / 'text'
  w.mkdir()
  config = _config('rope')
  config.data.dataset = 'embedded'
  (w / 'config.json').write_text(config.to_json_best_effort())
  assert cli.arithmetic_main(workdirs=[str(w)], per_length=1) == 2
  assert "not 'arithmetic'" in capsys.readouterr().err


_MESH_SCRIPT = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
import jax
from tests.evaluation import test_evaluation_runs as T
from bipe_jax.runs import restore as runs_lib
from bipe_jax.evaluation import sweep
from bipe_jax.state import mesh as mesh_lib
import ml_collections
path = sys.argv[2]
T._write_workdir(path, 'bipe_alibi')
sharded = runs_lib.load_run(path, mesh=mesh_lib.make_mesh(
    ml_collections.ConfigDict({'data': 2, 'fsdp': 1, 'tensor': 2})))
single = runs_lib.load_run(path, mesh=mesh_lib.make_mesh(
    ml_collections.ConfigDict({'data': 1, 'fsdp': 1, 'tensor': 1}), devices=jax.devices()[:1]))
kernel = sharded.params['layer_0']['mlp']['up']['kernel']
out = {'devices': jax.device_count(), 'kernel_spec': str(kernel.sharding.spec)}
for name, run in (('sharded', sharded), ('single', single)):
  r, = sweep.evaluate_run(run, [24], max_tokens=240, tokens_per_batch=72)
  out[name] = [r.nll_sum, r.tokens]
print(json.dumps(out))
'''


@pytest.mark.slow
def test_evaluation_sharded_over_a_4_device_mesh_matches_one_device(tmp_path):
  env = cpu_env(4)
  proc = forkserver.run([sys.executable, '-c', _MESH_SCRIPT, ROOT, str(tmp_path / 'w')],
                        capture_output=True, text=True, timeout=300, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out['devices'] == 4
  assert 'tensor' in out['kernel_spec']  # parameters really are laid out over the mesh
  assert out['sharded'][1] == out['single'][1] == 10 * 23
  np.testing.assert_allclose(out['sharded'][0], out['single'][0], rtol=1e-5)


def test_every_length_of_a_sweep_scores_the_same_number_of_targets(workdir):
  path, _, _ = workdir
  run = runs_lib.load_run(path)
  results = sweep.evaluate_run(run, [8, 16, 32], max_tokens=500, tokens_per_batch=64)
  # 500 tokens cut to 480 (a multiple of 32) at every length; positions 0, 8, 16, ... unscored
  assert [r.tokens for r in results] == [480 - 480 // 8] * 3
  assert [r.blocks for r in results] == [60, 30, 15]


def test_a_bipe_run_without_stored_separators_is_refused(tmp_path):
  path = str(tmp_path / 'old')
  _write_workdir(path, 'bipe_rope')
  config_file = os.path.join(path, 'config.json')
  with open(config_file) as f:
    saved = json.load(f)
  saved['model']['separator_ids'] = []
  with open(config_file, 'w') as f:
    json.dump(saved, f)
  with pytest.raises(runs_lib.RunError, match=r'config.json: .*bipe_rope.*separator'):
    runs_lib.load_run(path)


def test_cli_on_a_damaged_newest_checkpoint_prints_two_lines_and_no_traceback(trained_run,
                                                                             tmp_path):
  """eval/perplexity.py on a run whose newest checkpoint has its array files cut: one line for
  the damaged step, one for the step used, then the results; no traceback of the failed reads
  ("Event loop is closed"), nothing moved."""
  path = fixtures.copy_run(trained_run, tmp_path)
  assert fixtures.cut_array_files(os.path.join(path, 'checkpoints', '4', 'state'))
  # a real interpreter (not tests/forkserver.py's fork): what it prints at its exit counts too
  import subprocess  # pylint: disable=g-import-not-at-top
  proc = subprocess.run([sys.executable, 'eval/perplexity.py', f'--workdir={path}',
                         '--lengths=32', '--max_tokens=400', '--output='],
                        cwd=ROOT, env=cpu_env(), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  err = [l for l in proc.stderr.splitlines() if l.strip() and 'block/s' not in l]  # tqdm's bar
  assert len(err) == 2, proc.stderr[-3000:]
  assert err[0].startswith('WARNING: checkpoint step 4 in ') and 'is damaged' in err[0]
  assert err[1] == 'using checkpoint step 2, the newest that restores'
  out = proc.stdout.splitlines()
  assert len(out) == 4 and out[0].startswith(f'{path}: bipe_rope, step 2'), proc.stdout
  assert 'Traceback' not in proc.stderr + proc.stdout
  assert sorted(os.listdir(os.path.join(path, 'checkpoints'))) == ['2', '4']
