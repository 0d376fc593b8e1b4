"""Orbax checkpoints of the train state and of each process's data-iterator state.

A checkpoint is a step directory with two items:
- `state`: the TrainState (params, optimizer state, step, RNG) as sharded arrays. Restoring
  with a target that carries other shardings lays it out on another mesh (8 devices -> 1,
  1 -> 8).
- `data`: one JSON file per process, `process_<i>-of-<n>.json`, holding that process's grain
  iterator state, so a resumed run sees exactly the batches it would have seen. (States of
  the trainer's logical data shards are merged over the files on restore, so a checkpoint
  resumes on another process count with the same train.data_shards.)

Saves are asynchronous (Orbax writes in a background thread after a blocking copy to host)
and atomic: Orbax writes into a temporary directory that is renamed once complete, and only
complete step directories are candidates for resume. A latest checkpoint that fails to
restore (corrupt or missing files) is moved aside to `<dir>_corrupt/<step>` with a warning and
the previous one is used; a readable checkpoint of another model (other parameter shapes)
is an IncompatibleCheckpointError instead. Readers of a live workdir (evaluation) should use
`Checkpointer(dir, read_only=True)`.
"""

import dataclasses
import json
import shutil
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils


class IncompatibleCheckpointError(ValueError):
  """The checkpoint is intact but cannot be used by this run (e.g. other process count)."""


def _state_filename(process_index: int, process_count: int) -> str:
  return f'process_{process_index}-of-{process_count}.json'


class DataStateHandler(ocp.CheckpointHandler):
  """Saves this process's data-iterator state (JSON-able dict, or bytes) in its own file.

  The state is taken by the caller at save time (a snapshot), so an asynchronous save can
  never see an iterator that has moved on.
  """

  def save(self, directory: epath.Path, args: 'DataStateSave'):
    state = args.state
    if isinstance(state, bytes):
      payload = {'bytes': state.decode('latin-1')}
    else:
      payload = {'json': state}
    name = _state_filename(jax.process_index(), jax.process_count())
    (directory / name).write_text(json.dumps(payload))

  def restore(self, directory: epath.Path, args: Optional['DataStateRestore'] = None) -> Any:
    """This process's state; dict states with a 'shards' entry are merged over all processes.

    (The trainer's ShardedDataLoader saves {'num_shards', 'shards': {...}} per process, so a
    checkpoint written by N processes restores on M: every process sees every shard.)
    """
    files = sorted(directory.glob('process_*.json'))
    if not files:
      raise FileNotFoundError(f'no data-iterator state in {directory}')
    states = [self._load(p) for p in files]
    if all(isinstance(st, dict) and 'shards' in st for st in states):
      merged = dict(states[0])
      merged['shards'] = {}
      for st in states:
        merged['shards'].update(st['shards'])
      return merged
    path = directory / _state_filename(jax.process_index(), jax.process_count())
    if not path.exists():
      raise IncompatibleCheckpointError(
          f'checkpoint {directory.parent} holds data-iterator states '
          f'{[p.name for p in files]} for another process count; this run has '
          f'{jax.process_count()} processes')
    return self._load(path)

  @staticmethod
  def _load(path: epath.Path) -> Any:
    payload = json.loads(path.read_text())
    return payload['bytes'].encode('latin-1') if 'bytes' in payload else payload['json']

  def metadata(self, directory: epath.Path):
    return None

  def finalize(self, directory: epath.Path):
    pass

  def close(self):
    pass


@ocp.args.register_with_handler(DataStateHandler, for_save=True)
@dataclasses.dataclass
class DataStateSave(ocp.args.CheckpointArgs):
  state: Any


@ocp.args.register_with_handler(DataStateHandler, for_restore=True)
@dataclasses.dataclass
class DataStateRestore(ocp.args.CheckpointArgs):
  pass


def _shape_table(tree) -> dict:
  """{'[\'layer_0\'][...]': shape} of a nested dict of arrays or array metadata."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in flat}


class Checkpointer:
  """A CheckpointManager for (train state, data-iterator state) with resume fallback."""

  def __init__(self, directory: str, *, every_steps: int = 1, keep: int = 3,
               async_save: bool = True, read_only: bool = False):
    """read_only: for readers (evaluation) of a workdir a training run may still write to:
    no saves, and unfinished temporary directories are left alone."""
    self.directory = epath.Path(directory).absolute()
    self.read_only = read_only
    self._options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, save_interval_steps=every_steps,
        enable_async_checkpointing=async_save, create=not read_only, read_only=read_only,
        cleanup_tmp_directories=not read_only)  # leftovers of a save killed mid-way
    self._manager = self._new_manager()

  def _new_manager(self) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(self.directory, options=self._options,
                                 item_names=('state', 'data'))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state, data_state, *, force: bool = False) -> bool:
    """Starts a save of `state` and the iterator snapshot `data_state` at `step`.

    Without `force`, only every `every_steps` steps. Returns whether a save was started.
    """
    if step in self._manager.all_steps():
      return False
    return self._manager.save(
        step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                      data=DataStateSave(data_state)), force=force)

  def restore(self, step: int, abstract_state) -> tuple[Any, Any]:
    """(state, data_state) of `step`, the state laid out as `abstract_state`'s shardings."""
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                      data=DataStateRestore()))
    return restored['state'], restored['data']

  def restore_latest(self, abstract_state) -> Optional[tuple[int, Any, Any]]:
    """(step, state, data_state) of the newest checkpoint that restores, or None.

    A checkpoint that fails to restore is moved to `<dir>_corrupt/` (process 0) with a
    warning, then the previous one is tried. IncompatibleCheckpointError is not a
    corruption and propagates.
    """
    for step in reversed(self.all_steps()):
      try:
        state, data_state = self.restore(step, abstract_state)
        return step, state, data_state
      except IncompatibleCheckpointError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        self._raise_if_other_model(step, abstract_state)
        message = (f'WARNING: checkpoint step {step} in {self.directory} cannot be restored '
                   f'({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ""}); '
                   f'moving it to {self.directory}_corrupt/ and falling back to the previous '
                   f'checkpoint')
        logging.warning(message)
        if jax.process_index() == 0:
          print(message, flush=True)
        if not self.read_only:
          self._quarantine(step)
    return None

  def _raise_if_other_model(self, step: int, abstract_state):
    """A readable checkpoint whose parameter shapes differ from this config is not corrupt:
    raise IncompatibleCheckpointError instead of moving it (and every older one) aside."""
    try:
      metadata = ocp.StandardCheckpointHandler().metadata(self._step_dir(step) / 'state')
      saved = _shape_table(metadata['params'])
    except Exception:  # pylint: disable=broad-except
      return  # unreadable metadata: corrupt
    wanted = _shape_table(abstract_state.params)
    if saved != wanted:
      diff = sorted(set(saved.items()) ^ set(wanted.items()))[:4]
      raise IncompatibleCheckpointError(
          f'checkpoint step {step} in {self.directory} holds parameters of another model '
          f'(differences, checkpoint vs config: {diff}); use the config it was trained with or '
          f'a new workdir')

  def _quarantine(self, step: int):
    self._manager.wait_until_finished()
    if jax.process_index() == 0:
      src = self._step_dir(step)
      dst = epath.Path(str(self.directory) + '_corrupt')
      dst.mkdir(parents=True, exist_ok=True)
      target = dst / src.name
      if target.exists():
        shutil.rmtree(str(target))
      shutil.move(str(src), str(target))
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f'bipe_jax_quarantine_{step}')
    self._manager.close()
    self._manager = self._new_manager()

  def _step_dir(self, step: int) -> epath.Path:
    for path in self.directory.iterdir():
      if path.is_dir() and path.name.split('_')[-1] == str(step):
        return path
    raise FileNotFoundError(f'no directory for checkpoint step {step} in {self.directory}')

  def reached_preemption(self, step: int) -> bool:
    """True when the JAX preemption service (multi-host) signalled preemption at `step`."""
    return self._manager.reached_preemption(step)

  def wait(self):
    self._manager.wait_until_finished()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()
