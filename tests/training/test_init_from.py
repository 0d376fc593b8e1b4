"""Fine-tuning from a trained model (`train.init_from`): parameters only, fresh optimizer, step 0;
from a workdir (optionally @STEP) or a Hugging Face folder; clear errors on a mismatch."""

import os

import chex
import jax
import numpy as np
import pytest

from bipe_jax import config as model_config_lib
from bipe_jax import model as model_lib
from bipe_jax.runs import restore as runs
from bipe_jax.interop import convert
from bipe_jax.training import init_from
from bipe_jax.training import init_from_shapes
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer as optimizer_lib
from bipe_jax.state import train_state as train_state_lib
from tests.fixtures import checkpoint_steps, run_cli

pytestmark = [pytest.mark.slow]

ROPE = '--config.model.position_encoding=rope'  # exportable to a Hugging Face Llama folder


@pytest.fixture(scope='module')
def source(trained_rope_run):
  """The session's finished 4-step rope run (tests/fixtures.py; checkpoints 2 and 4)."""
  return trained_rope_run


def fresh_state(workdir):
  config = runs.read_config(workdir)
  model = model_lib.Transformer(model_config_lib.model_config_from_dict(config.model))
  tx = optimizer_lib.make_optimizer(config.train)
  mesh = mesh_lib.make_mesh(config.mesh, devices=jax.devices()[:1])
  return train_state_lib.create_train_state(model, tx, mesh, int(config.data.seq_len), seed=5)


def test_parse_source():
  assert runs.parse_source('/a/b@12') == ('/a/b', 12)
  assert runs.parse_source('/a/b') == ('/a/b', None)


def test_params_come_from_the_source_and_the_optimizer_stays_fresh(source, tmp_path):
  state, shardings = fresh_state(source)
  for spec, step in ((source, 4), (f'{source}@2', 2)):
    new, description = init_from.with_source_params(state, spec, shardings.params)
    assert f'checkpoint step {step}' in description
    want = runs.load_run(source, step=step).params
    chex.assert_trees_all_equal(jax.device_get(new.params), jax.device_get(want))
    chex.assert_trees_all_equal(jax.device_get(new.opt_state), jax.device_get(state.opt_state))
    assert int(new.step) == 0
  # The same parameters through a Hugging Face folder written from the source.
  hf = convert.workdir_to_hf(source, str(tmp_path / 'hf'))
  new, description = init_from.with_source_params(state, hf, shardings.params)
  assert 'Hugging Face' in description
  chex.assert_trees_all_close(jax.device_get(new.params),
                              jax.device_get(runs.load_run(source).params), rtol=1e-6)


def test_mismatches_name_the_parameter(source, tmp_path):
  state, _ = fresh_state(source)
  params = jax.device_get(state.params)
  wide = jax.tree_util.tree_map_with_path(
      lambda p, x: np.zeros(x.shape[:-1] + (x.shape[-1] + 1,)) if 'lm_head' in
      jax.tree_util.keystr(p) else x, params)
  with pytest.raises(init_from.InitFromError, match=r"\['lm_head'\]\['kernel'\] has shape"):
    init_from.check_compatible(wide, params)
  fewer = {k: v for k, v in params.items() if k != 'final_norm'}
  with pytest.raises(init_from.InitFromError, match="no parameter .*final_norm"):
    init_from.check_compatible(fewer, params)
  with pytest.raises(init_from.InitFromError, match='is not a directory'):
    init_from.load_source_params(str(tmp_path / 'nowhere'))
  with pytest.raises(init_from.InitFromError, match='checkpoint step 3 is not in'):
    init_from.load_source_params(f'{source}@3')


def test_cli_fine_tunes_from_a_run_with_other_rope_scaling(dirs, source, tmp_path):
  workdir = str(tmp_path / 'tuned')
  proc = run_cli(dirs, workdir, '--config.train.steps=2', '--config.checkpoint.every_steps=2',
                 '--config.checkpoint.async_save=False', f'--config.train.init_from={source}@2', ROPE,
                 '--config.model.rope_scaling=yarn', '--config.model.rope_scaling_factor=2.0')
  assert f'parameters from {source} (checkpoint step 2' in proc.stdout
  assert 'optimizer state fresh, step 0' in proc.stdout and 'training steps 1..2' in proc.stdout
  assert checkpoint_steps(workdir) == [2]
  # YaRN's original length, not set, is the length the source was trained at.
  tuned, trained = runs.read_config(workdir), runs.read_config(source)
  assert tuned.model.rope_original_length == trained.data.seq_len
  assert init_from.source_seq_len(f'{source}@2') == trained.data.seq_len
  assert init_from.source_seq_len('') is None


@pytest.mark.parametrize('flag, expected', [
    ('--config.model.hidden_size=48', "parameter ['embed']['embedding'] has shape (320, 32) in "
                                      "the source, (320, 48) in this model"),
    ('--config.model.num_layers=2', "the source has no parameter ['layer_1']"),
])
def test_cli_refuses_a_source_of_another_shape_before_writing_anything(dirs, source, tmp_path,
                                                                       flag, expected):
  workdir = str(tmp_path / 'other')
  proc = run_cli(dirs, workdir, '--config.train.steps=2', f'--config.train.init_from={source}',
                 ROPE, flag, expect=2)
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('config error: train.init_from: '), proc.stderr
  assert expected in lines[0], lines[0]
  assert not os.path.exists(workdir)  # no data prepared, no tokenizer copy, no log file


def shape_table(tree) -> dict:
  return {jax.tree_util.keystr(p): tuple(x.shape) for p, x in
          jax.tree_util.tree_leaves_with_path(tree)}


def test_source_shapes_come_from_metadata_and_match_the_model(source, tmp_path):
  config = runs.read_config(source)
  want = shape_table(init_from_shapes.run_param_shapes(config))
  assert len(want) > 10
  for spec in (source, f'{source}@2'):  # Orbax's array metadata of the checkpoint
    assert shape_table(init_from_shapes.source_param_shapes(spec, 32)) == want
  hf = convert.workdir_to_hf(source, str(tmp_path / 'hf'))  # the model of its config.json
  assert shape_table(init_from_shapes.source_param_shapes(hf, 32)) == want
  yarn = runs.read_config(source)  # bipe_rope + YaRN: its original length (segments) is 0
  yarn.model.update(position_encoding='bipe_rope', rope_scaling='yarn', rope_original_length=0,
                    separators='sentence', separator_ids=())  # until the data resolves it
  assert shape_table(init_from_shapes.run_param_shapes(yarn)).keys() - want.keys() == {
      "['intra_embed']['embedding']"}
  config.train.init_from = source
  config.model.scan_layers = True  # the other layer layout: converted, the same shapes
  init_from_shapes.check_param_shapes(config)
  config.model.hidden_size = 48
  with pytest.raises(init_from.InitFromError, match=r"\['embed'\]\['embedding'\] has shape "
                                                    r"\(320, 32\) in the source, \(320, 48\)"):
    init_from_shapes.check_param_shapes(config)


def test_a_converted_model_holds_parameters_only_and_is_fine_tuned_not_resumed(
    dirs, source, tmp_path):
  hf = convert.workdir_to_hf(source, str(tmp_path / 'hf'))
  converted = convert.hf_to_workdir(hf, str(tmp_path / 'converted'), seq_len=64)
  (step_dir,) = [os.path.join(converted, 'checkpoints', n)
                 for n in os.listdir(os.path.join(converted, 'checkpoints')) if n.isdigit()]
  assert 'params' in os.listdir(step_dir) and 'state' not in os.listdir(step_dir)
  state, shardings = fresh_state(source)
  new, description = init_from.with_source_params(state, converted, shardings.params)
  assert 'checkpoint step 0' in description
  chex.assert_trees_all_close(jax.device_get(new.params),
                              jax.device_get(runs.load_run(source).params), rtol=1e-6)
  proc = run_cli(dirs, converted, '--config.train.steps=2', ROPE, expect=2)
  line = proc.stderr.strip().splitlines()[-1]
  assert 'holds parameters only (a converted model, step 0)' in line
  assert f'--config.train.init_from={converted}' in line and 'Traceback' not in proc.stderr


def test_cli_checks_the_source_before_writing_anything(dirs, source, tmp_path):
  workdir = str(tmp_path / 'never')
  for spec, expected in (
      (str(tmp_path / 'nowhere'), 'nowhere does not exist'),
      (source, "the source was trained with model.position_encoding='rope', this run uses "
               "'bipe_rope'")):
    proc = run_cli(dirs, workdir, '--config.train.steps=2', f'--config.train.init_from={spec}',
                   expect=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert lines[0].startswith(f"config error: train.init_from='{spec}'")
    assert not os.path.exists(workdir)  # no checkpoints/, tokenizer, metrics, stats, log
  assert 'init_from_allow_encoding_change=true' in lines[0]


def test_check_source_names_the_path_the_step_and_the_streams(source, tmp_path):
  config = runs.read_config(source)
  with config.unlocked():
    config.train.init_from = source
  init_from.check_source(config)  # the source itself: the same streams
  for spec, pattern in ((str(tmp_path), 'holds no run: neither a bipe_jax workdir'),
                        (f'{source}@3', r'checkpoint step 3 is not in .* \[2, 4\]')):
    config.train.init_from = spec
    with pytest.raises(init_from.InitFromError, match=pattern):
      init_from.check_source(config)
  config.train.init_from = source
  config.model.position_encoding = 'bipe_rope'
  with pytest.raises(init_from.InitFromError, match="'rope', this run uses 'bipe_rope'"):
    init_from.check_source(config)
  config.train.init_from_allow_encoding_change = True  # a deliberate change
  init_from.check_source(config)


def test_stream_mismatch_compares_encoding_and_separators_rule():
  bipe = {'position_encoding': 'bipe_rope', 'separators': 'sentence', 'separator_ids': (5, 6)}
  assert init_from.stream_mismatch(bipe, None, dict(bipe), None) is None
  assert 'bipe_alibi' in init_from.stream_mismatch(
      bipe, None, dict(bipe, position_encoding='bipe_alibi'), None)
  assert "separators='sentence', this run with 'newline'" in init_from.stream_mismatch(
      bipe, None, dict(bipe, separators='newline'), None)
  assert 'separator ids (5, 6), this run at (7,)' in init_from.stream_mismatch(
      bipe, None, dict(bipe, separators='ids', separator_ids=(7,)), None)
  assert init_from.stream_mismatch(bipe, None, dict(bipe, separators='ids'), None) is None
  rope = {'position_encoding': 'rope', 'separators': 'sentence'}
  assert init_from.stream_mismatch(rope, None, dict(rope, separators='newline'), None) is None
