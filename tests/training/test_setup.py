"""One set-up path (training/setup.py): training, the ahead-of-time compile and resuming from a
checkpoint use one `build`; evaluation and generation restore parameters only."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import generation
from bipe_jax.runs import restore as runs_lib
from bipe_jax.runs import run_record
from bipe_jax.state import checkpointing
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer as optimizer_lib
from bipe_jax.state import train_state as train_state_lib
from bipe_jax.training import resolve as resolve_lib
from bipe_jax.training import setup as setup_lib
from configs import tiny


def tiny_config():
  config = tiny.get_config()
  m = config.model
  m.position_encoding, m.separators, m.separator_ids = 'bipe_rope', 'ids', (3,)
  m.num_layers, m.hidden_size, m.num_heads, m.ffn_size, m.vocab_size = 1, 32, 2, 64, 64
  m.max_intra = m.max_position = m.block_size = m.train_length = m.rope_original_length = 16
  config.data.seq_len, config.train.batch_size = 16, 2
  config.mesh.data = config.mesh.fsdp = config.mesh.tensor = 1
  return config


@pytest.fixture(scope='module')
def setup():
  resolved = resolve_lib.resolve(tiny_config(), device_count=1)
  return setup_lib.build(resolved, mesh_lib.make_mesh(resolved.mesh, devices=jax.devices()[:1]))


def _tokens(seed: int):
  rng = np.random.default_rng(seed)
  return {'tokens': jnp.asarray(rng.integers(4, 64, size=(2, 16)), jnp.int32)}


@pytest.fixture(scope='module')
def trained(setup, tmp_path_factory):
  """(workdir, state after 2 steps of the setup's step, its losses): saved as a training run."""
  state, _ = setup.fresh_state(seed=0)
  losses = []
  with setup.context():
    for step in range(2):
      state, scalars = setup.step_fn(state, _tokens(step))
      losses.append(float(scalars['loss']))
  workdir = str(tmp_path_factory.mktemp('run'))
  run_record.write_config(workdir, setup.config.to_config_dict())
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'), async_save=False)
  ckpt.save(2, state, {'position': 2}, force=True)
  ckpt.close()
  return workdir, jax.device_get(state), losses


def test_one_setup_trains_compiles_and_restores(setup, trained):
  from bipe_jax.compile import aot  # pylint: disable=g-import-not-at-top (compile is the top layer)
  workdir, state, losses = trained
  # training: the setup's step ran twice on its fresh state
  assert int(state.step) == 2 and all(np.isfinite(losses))
  assert jax.tree.structure(state.params) == jax.tree.structure(setup.abstract.params)
  # compile: the same step and state layout, compiled for this setup's devices
  report = aot.compile_setup(setup, 'cpu')
  assert report.steps[0].name == 'train' and report.num_devices == 1
  assert report.param_bytes == sum(a.size * 4 for a in jax.tree.leaves(setup.abstract.params))
  # restore (resuming): the checkpoint restores onto the setup's target, equal to what was saved
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'), read_only=True)
  restored, data_state = ckpt.restore(2, setup.target())
  ckpt.close()
  assert data_state == {'position': 2}
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), state)
  # and it trains on from there exactly as the state it came from
  with setup.context():
    _, again = setup.step_fn(restored, _tokens(2))
    _, first = setup.step_fn(jax.device_put(state, setup.shardings), _tokens(2))
  assert float(again['loss']) == float(first['loss'])


def _refuse(*args, **kwargs):
  raise AssertionError('optimizer state built while evaluating or generating')


def test_evaluating_and_generating_restore_parameters_only(trained, monkeypatch):
  workdir, state, _ = trained
  monkeypatch.setattr(optimizer_lib, 'make_optimizer', _refuse)
  monkeypatch.setattr(train_state_lib, 'state_shardings', _refuse)
  monkeypatch.setattr(checkpointing.Checkpointer, 'restore', _refuse)  # the whole train state
  run = runs_lib.load_run(workdir)
  assert run.step == 2
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(run.params), state.params)
  out = generation.generate_from_workdir(workdir, prompt_ids=[1, 5, 3, 7], max_new_tokens=3,
                                         stop_at_eos=False)
  assert out['step'] == 2 and len(out['samples'][0]) == 3


def test_the_refusals_above_fire_on_the_train_state_path(setup, monkeypatch):
  """Building a train state's set-up goes through what the test above refuses, so its passing
  means evaluation and generation built none."""
  monkeypatch.setattr(optimizer_lib, 'make_optimizer', _refuse)
  with pytest.raises(AssertionError, match='optimizer state'):
    setup_lib.build(setup.config, setup.mesh)
  monkeypatch.undo()
  monkeypatch.setattr(train_state_lib, 'state_shardings', _refuse)
  with pytest.raises(AssertionError, match='optimizer state'):
    setup_lib.build(setup.config, setup.mesh)


def test_a_save_that_fails_while_finishing_is_named_as_maybe_complete(tmp_path, monkeypatch):
  """Orbax forgets a step whose finishing failed, though its completion marker may already be
  written (then a resumed run starts from it): the error names the last step known saved and
  the one that may be complete, and a new Checkpointer finds the latter complete."""
  directory = str(tmp_path / 'checkpoints')
  state = {'w': jnp.arange(4.0)}
  ckpt = checkpointing.Checkpointer(directory, async_save=True)
  assert ckpt.save(2, state, {'position': 2}, force=True)
  ckpt.poll()
  ckpt._manager.wait_until_finished()  # pylint: disable=protected-access
  assert ckpt.save(4, state, {'position': 4}, force=True)
  manager = ckpt._manager  # pylint: disable=protected-access
  finish = manager.wait_until_finished

  def finish_then_fail():  # the marker is written, then finishing fails, as on a dying bucket
    finish()
    manager._checkpoints.delete_if(lambda info: info.step == 4)  # pylint: disable=protected-access
    raise OSError('connection refused')

  monkeypatch.setattr(manager, 'wait_until_finished', finish_then_fail)
  with pytest.raises(checkpointing.CheckpointSaveError) as failed:
    ckpt.close()
  message = str(failed.value)
  assert 'could not save checkpoint step 4' in message, message
  assert ('the last checkpoint saved is step 2 (or step 4, if its save, cut short, completed: '
          'resuming takes the newest complete one)') in message, message
  assert ckpt.last_saved_step() == 2
  again = checkpointing.Checkpointer(directory, read_only=True)
  assert again.all_steps() == [2, 4]
  again.close()


def test_abandon_after_a_storage_failure_waits_for_no_save(tmp_path, monkeypatch):
  """The storage stopped answering: the run lets go of a save in flight instead of waiting out
  its retries (or the save timeout); the line names the last step known saved and the one in
  flight as maybe complete."""
  ckpt = checkpointing.Checkpointer(str(tmp_path / 'checkpoints'), async_save=True)
  state = {'w': jnp.arange(4.0)}
  assert ckpt.save(2, state, {'position': 2}, force=True)
  ckpt.wait()
  assert ckpt.save(4, state, {'position': 4}, force=True)
  manager = ckpt._manager  # pylint: disable=protected-access

  def hang():
    raise AssertionError('abandon waited for the save in flight')

  monkeypatch.setattr(manager, 'wait_until_finished', hang)
  monkeypatch.setattr(manager, 'close', hang)
  ckpt.abandon()
  assert ckpt.last_saved_text() == (
      'the last checkpoint saved is step 2 (or step 4, if its save, cut short, completed: '
      'resuming takes the newest complete one)')
  monkeypatch.undo()
  manager.wait_until_finished()
