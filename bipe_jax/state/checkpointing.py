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
complete step directories are candidates for resume.

Restoring the newest checkpoint tells three failures apart (`restore_latest`):
- its saved *structure* (every array's path and shape, parameters and optimizer state) differs
  from the run's: an IncompatibleCheckpointError that names the differences; nothing is moved
  (the usual cause is a changed setting, e.g. train.grad_clip adds or removes an optimizer
  state, not a damaged file);
- a read error: retried once, so a transient failure moves nothing;
- the structure matches but the data does not read twice (truncated or corrupt files): that one
  checkpoint fails its integrity check, is moved aside to `<dir>_corrupt/<step>` with a warning,
  and the previous one is tried. When checkpoints existed and none restored, the run stops with
  CheckpointsUnusableError instead of starting again from step 0, unless the caller allows a
  fresh start (`checkpoint.allow_fresh_start`).
Readers of a live workdir (evaluation) should use `Checkpointer(dir, read_only=True)`.

A save that fails (the storage stopped answering) raises CheckpointSaveError, one line naming
the step, the folder and the last checkpoint that was saved: at the next `save`, `poll` (each
training step of a single-process run: it never waits) or `close`. Bounded, so that a save never
hangs a run: tensorstore's GCS retries (bipe_jax.storage_faults.tensorstore_retries) and the
whole background save (SAVE_TIMEOUT_ENV, default DEFAULT_SAVE_TIMEOUT_S).
"""

import dataclasses
import json
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bipe_jax import restore_messages
from bipe_jax import storage
from bipe_jax import storage_faults
from bipe_jax.state import tensorstore_auth
from jax.experimental import multihost_utils

SAVE_TIMEOUT_ENV = 'BIPE_JAX_CHECKPOINT_TIMEOUT_S'
DEFAULT_SAVE_TIMEOUT_S = 600  # a background save still running after this fails (Orbax: 1200)


class IncompatibleCheckpointError(ValueError):
  """The checkpoint is intact but cannot be used by this run (e.g. other process count)."""


class CheckpointsUnusableError(RuntimeError):
  """Checkpoints existed but none restored: the run refuses to start again from step 0."""


class CheckpointSaveError(RuntimeError):
  """A checkpoint could not be saved (one line: the step, the folder, the last one saved)."""


def save_timeout_s(environ=None) -> int:
  """Seconds a background save may take (SAVE_TIMEOUT_ENV); a bad value is a ValueError."""
  environ = os.environ if environ is None else environ
  text = environ.get(SAVE_TIMEOUT_ENV, '').strip()
  if not text:
    return DEFAULT_SAVE_TIMEOUT_S
  if not text.isdigit() or int(text) < 1:
    raise ValueError(f'{SAVE_TIMEOUT_ENV}={text!r}: must be a whole number of seconds >= 1')
  return int(text)


def bound_tensorstore_retries() -> None:
  """Makes every tensorstore context Orbax creates (its `get_ts_context` copies these two
  dicts) retry a GCS request as bipe_jax.storage_faults.RetryPolicy says, instead of
  tensorstore's default of 32 retries with waits of up to 32 s (a quarter of an hour per
  request). Read again at each Checkpointer, so the environment's current bound applies."""
  # pylint: disable-next=g-import-not-at-top
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
  resource = storage_faults.tensorstore_retries()
  contexts = (ts_utils._BASE_TS_CONTEXT,  # pylint: disable=protected-access
              ts_utils._DEFAULT_OCDBT_TS_CONTEXT)  # pylint: disable=protected-access
  for context in contexts:
    context['gcs_request_retries'] = dict(resource)


def _one_line(error: BaseException, limit: int = 160) -> str:
  """The error's first words: tensorstore's messages run to a whole spec."""
  return restore_messages.short_reason(error, limit)


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


def _key_name(key) -> str:
  for attr in ('name', 'key', 'idx'):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _shape_table(tree) -> dict:
  """{'params/layer_0/...': shape} of a train state (dataclass / named tuples, as built) or
  of its Orbax metadata (nested dicts and lists, as saved): the same keys for the same state."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {'/'.join(_key_name(k) for k in path): tuple(leaf.shape) for path, leaf in flat}


def step_dirs(directory: str) -> dict[int, str]:
  """{step: folder} of the complete checkpoints in `directory` (Orbax step folders named by
  their number), without opening a CheckpointManager; {} when there is none."""
  if not storage.isdir(directory):
    return {}
  steps = {}
  for name in storage.listdir(directory):
    tail = name.split('_')[-1]
    if (tail.isdigit() and '.orbax' not in name
        and storage.isdir(os.path.join(directory, name))):
      steps[int(tail)] = os.path.join(directory, name)
  return steps


def item_metadata(step_dir: str, item: str):
  """Orbax's metadata of one item ('state', 'params') of a step folder: its saved tree with an
  ArrayMetadata (shape, dtype) per array, read without restoring anything."""
  tensorstore_auth.start_quietly(step_dir)
  handler = ocp.StandardCheckpointHandler()
  try:
    return handler.metadata(epath.Path(step_dir) / item).tree
  finally:
    handler.close()


def saved_param_shapes(step_dir: str) -> dict:
  """The parameters saved in a step folder (a training run's `state`, or the `params` of a
  converted model) as a tree of jax.ShapeDtypeStruct, from Orbax's metadata: no array read."""
  items = set(storage.listdir(step_dir))
  tree = (item_metadata(step_dir, 'state')['params'] if 'state' in items
          else item_metadata(step_dir, 'params'))
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree)


def params_only_step(directory: str) -> Optional[int]:
  """The newest step of `directory` when it holds parameters only (a converted model, see
  `Checkpointer.save_params`), else None (no checkpoint, or a training run's)."""
  steps = step_dirs(directory)
  if not steps:
    return None
  newest = max(steps)
  items = set(storage.listdir(steps[newest]))
  return newest if 'params' in items and 'state' not in items else None


class Checkpointer:
  """A CheckpointManager for (train state, data-iterator state) with resume fallback."""

  def __init__(self, directory: str, *, every_steps: int = 1, keep: int = 3,
               async_save: bool = True, read_only: bool = False):
    """read_only: for readers (evaluation) of a workdir a training run may still write to:
    no saves, and unfinished temporary directories are left alone."""
    self.directory = epath.Path(storage.absolute(directory))  # gs:// kept as it is
    self.read_only = read_only
    if not storage.is_local(directory):
      bound_tensorstore_retries()
      tensorstore_auth.start_quietly(directory)  # its credentials line to the log, not stderr
    self._options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, save_interval_steps=every_steps,
        enable_async_checkpointing=async_save, create=not read_only, read_only=read_only,
        cleanup_tmp_directories=not read_only,  # leftovers of a save killed mid-way
        async_options=ocp.AsyncOptions(timeout_secs=save_timeout_s()))
    self._manager = self._new_manager()
    self._pending: Optional[int] = None  # the step of a save started and not yet seen complete
    self._unsure: Optional[int] = None  # a step whose save failed after it may have completed
    self._failed: Optional[CheckpointSaveError] = None
    self._single = jax.process_count() == 1

  def _new_manager(self) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(self.directory, options=self._options,
                                 item_names=('state', 'data', 'params'))

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state, data_state, *, force: bool = False) -> bool:
    """Starts a save of `state` and the iterator snapshot `data_state` at `step`.

    Without `force`, only every `every_steps` steps. Returns whether a save was started.
    """
    if step in self._manager.all_steps():
      return False
    self._finish_pending()
    try:
      started = self._manager.save(
          step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                        data=DataStateSave(data_state)), force=force)
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(step, e) from None
    if started:
      self._pending = step
      if not self._options.enable_async_checkpointing:
        self._finish_pending()
    return started

  def last_saved_step(self) -> Optional[int]:
    """The newest step whose save completed (None when none did)."""
    done = [s for s in self._manager.all_steps() if s not in (self._pending, self._unsure)]
    return max(done) if done else None

  def last_saved_text(self, where: str = '') -> str:
    """'the last checkpoint saved is step N' (or 'no checkpoint was saved'), naming also a
    save that may have completed without the run seeing it: one still in flight, or one whose
    finishing failed after Orbax may have written its completion marker (Orbax then forgets
    the step, but a resumed run finds it complete and starts from it)."""
    last = self.last_saved_step()
    where = f' in {where}' if where else ''
    kept = (f'the last checkpoint saved is step {last}{where}' if last is not None
            else f'no checkpoint was saved{where}')
    unsure = self._pending if self._pending is not None else self._unsure
    if unsure is not None and (last is None or unsure > last):
      kept += (f' (or step {unsure}, if its save, cut short, completed: resuming takes the '
               'newest complete one)')
    return kept

  def _save_failed(self, step: int, error: BaseException, *,
                   may_have_completed: bool = False) -> CheckpointSaveError:
    """The one-line error for the save of `step` that failed with `error` (kept: `close`
    then neither waits nor raises again). `may_have_completed`: the failure came while the
    save was finishing, after its data may all have been written."""
    self._pending = None
    if may_have_completed:
      self._unsure = step
    kept = self.last_saved_text()
    if isinstance(error, storage_faults.StorageUnreachableError):
      cause = str(error)  # names the bucket and the endpoint
    elif storage.is_local(str(self.directory)):
      cause = _one_line(error)
    else:  # tensorstore's: names the object, not the endpoint
      cause = f'storage at {storage_faults.endpoint()}: {_one_line(error)}'
    self._failed = CheckpointSaveError(
        f'could not save checkpoint step {step} in {self.directory}: {cause}; stopping rather '
        f'than training past it; {kept}, and running the same command resumes from it')
    return self._failed

  def _finish_pending(self) -> None:
    """Waits for the save in flight, if any; CheckpointSaveError when it failed."""
    if self._failed is not None:
      raise self._failed
    if self._pending is None:
      return
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_failed(self._pending, e, may_have_completed=True) from None
    self._pending = None

  def poll(self) -> None:
    """CheckpointSaveError when a background save has failed; never waits. (Single-process
    runs only: processes must agree on the step they stop at, so a multi-process run learns of
    a failed save at its next save, which every process reaches.)"""
    if self._failed is not None:
      raise self._failed
    if (self._single and self._pending is not None
        and not self._manager.is_saving_in_progress()):
      self._finish_pending()

  def save_params(self, step: int, params) -> None:
    """Saves parameters only (a converted model: no optimizer state, no data position), so a
    conversion needs the memory of the parameters, not of a whole train state."""
    self._manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params)),
                       force=True)
    self._manager.wait_until_finished()

  def is_params_only(self, step: int) -> bool:
    """Whether checkpoint `step` holds parameters only (written by `save_params`)."""
    folder = self._step_dir(step)
    return (folder / 'params').exists() and not (folder / 'state').exists()

  def restore_params(self, step: int, abstract_params) -> Any:
    """The parameters of a `save_params` checkpoint, laid out as `abstract_params`."""
    restored = self._manager.restore(
        step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params)))
    return restored['params']

  def restore_trained_params(self, step: int, abstract_params) -> Any:
    """The parameters of `step`, laid out as `abstract_params`: of a training checkpoint only
    the train state's `params` are read (no optimizer state is built or restored); a
    `save_params` checkpoint restores as `restore_params`."""
    if self.is_params_only(step):
      return self.restore_params(step, abstract_params)
    # closed at once (its handler's threads and metadata store): a checkpointer left to the
    # interpreter's exit schedules work on executors already shut down (a traceback after the
    # command's own error line)
    with ocp.PyTreeCheckpointer() as checkpointer:
      restored = checkpointer.restore(
          self._step_dir(step) / 'state', args=ocp.args.PyTreeRestore(
              item={'params': abstract_params}, partial_restore=True,
              restore_args={'params': ocp.checkpoint_utils.construct_restore_args(
                  abstract_params)}))
    return restored['params']

  def restore(self, step: int, abstract_state) -> tuple[Any, Any]:
    """(state, data_state) of `step`, the state laid out as `abstract_state`'s shardings."""
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                      data=DataStateRestore()))
    return restored['state'], restored['data']

  def restore_latest(self, abstract_state, *, allow_fresh_start: bool = False
                     ) -> Optional[tuple[int, Any, Any]]:
    """(step, state, data_state) of the newest checkpoint that restores; None when there is none.

    See the module docstring for how structure mismatches, transient read errors and damaged
    checkpoints are told apart. Raises IncompatibleCheckpointError (nothing moved) or, when
    every existing checkpoint failed its integrity check, CheckpointsUnusableError (unless
    `allow_fresh_start`).
    """
    steps = self.all_steps()
    for step in reversed(steps):
      error = None
      for _ in range(2):  # a transient read error gets one retry
        try:
          with restore_messages.quiet_failed_reads():
            state, data_state = self.restore(step, abstract_state)
          return step, state, data_state  # the trainer prints the step it resumed from
        except IncompatibleCheckpointError:
          raise
        except Exception as e:  # pylint: disable=broad-except
          restore_messages.install_unraisable_filter()
          self._raise_if_other_structure(step, abstract_state)
          error = e
      action = ('leaving it in place (read-only)' if self.read_only else
                f'moving it to {self.directory}_corrupt/')
      message = restore_messages.damaged_line(
          step, str(self.directory), error,
          f'{action} and falling back to the previous checkpoint')
      if jax.process_index() == 0:  # once on the terminal; the library log keeps it too
        print(message, flush=True)
        logging.info(message)
      else:
        logging.warning(message)
      if not self.read_only:
        self._quarantine(step)
    if steps and not allow_fresh_start:
      raise CheckpointsUnusableError(
          f'none of the checkpoints {steps} in {self.directory} could be restored (each failed '
          f'its integrity check and was set aside in {self.directory}_corrupt/); refusing to '
          f'start again from step 0: set checkpoint.allow_fresh_start=True to do that')
    return None

  def _raise_if_other_structure(self, step: int, abstract_state):
    """A readable checkpoint whose saved arrays (paths and shapes) differ from this run's state
    is not corrupt: raise IncompatibleCheckpointError naming the differences, move nothing."""
    try:
      saved = _shape_table(item_metadata(str(self._step_dir(step)), 'state'))
    except Exception:  # pylint: disable=broad-except
      return  # unreadable metadata: an integrity failure, not another structure
    wanted = _shape_table(abstract_state)
    if saved == wanted:
      return
    params_first = lambda k: (not k.startswith('params/'), k)  # pylint: disable=unnecessary-lambda-assignment
    only_saved = sorted(set(saved) - set(wanted), key=params_first)
    only_run = sorted(set(wanted) - set(saved), key=params_first)
    reshaped = sorted((k for k in set(saved) & set(wanted) if saved[k] != wanted[k]),
                      key=params_first)
    parts = []
    for label, keys, table in (('only in the checkpoint', only_saved, saved),
                               ('only in this run', only_run, wanted)):
      if keys:
        parts.append(f'{label}: ' + ', '.join(f'{k} {table[k]}' for k in keys[:3])
                     + (f' (+{len(keys) - 3} more)' if len(keys) > 3 else ''))
    if reshaped:
      parts.append('other shapes: ' + ', '.join(
          f'{k} {saved[k]} in the checkpoint vs {wanted[k]}' for k in reshaped[:3]))
    kind = 'parameters' if any(k.startswith('params/') for k in only_saved + only_run + reshaped) \
        else 'optimizer state'
    raise IncompatibleCheckpointError(
        f'checkpoint step {step} in {self.directory} was saved by a run with other {kind} '
        f'({"; ".join(parts)}): a model or optimizer setting differs from the one it was '
        f'trained with (e.g. train.grad_clip, train.weight_decay, model.*); resume with those '
        f'settings or use a new workdir. Nothing was moved.')

  def _quarantine(self, step: int):
    self._manager.wait_until_finished()
    if jax.process_index() == 0:
      src = self._step_dir(step)
      dst = epath.Path(str(self.directory) + '_corrupt')
      dst.mkdir(parents=True, exist_ok=True)
      target = dst / src.name
      if target.exists():
        storage.rmtree(target)
      storage.move(src, target)
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
    self._finish_pending()

  def close(self):
    """Waits for the save in flight (CheckpointSaveError when it failed) and closes. After a
    failed save it only lets go: nothing more is waited for or raised."""
    if self._failed is None:
      try:
        self._finish_pending()
      finally:
        if self._failed is None:
          self._manager.close()
      return
    self._abandon()

  def abandon(self) -> None:
    """Lets go after the storage stopped answering, without waiting for a save in flight (it
    would wait out its retries, or the save timeout, against that storage; the run ends next).
    That save's step stays named by `last_saved_text` as one that may have completed."""
    if self._pending is not None:
      self._unsure, self._pending = self._pending, None

  def _abandon(self) -> None:
    """Closes after a failed save: Orbax's close raises the failed save again, which was
    reported once already."""
    try:
      self._manager.close()
    except Exception:  # pylint: disable=broad-except  (the failure was reported once)
      logging.info('closing the checkpoint manager after a failed save', exc_info=True)
