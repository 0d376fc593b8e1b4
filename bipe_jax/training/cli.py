"""What `train/main.py` runs: start the distributed runtime, train, turn errors into one line.

Exit codes (bipe_jax.cli; docs/tpu.md's relaunch loop reads them):
- 0 done: the run reached train.steps (or its data ended), its last checkpoint saved;
- 1 non-finite loss (the last good checkpoint stays the latest);
- 2 a user's error: bad config, unusable checkpoint, a workdir another process is training in, a
  workdir (or checkpoint folder) that takes no write, no such bucket;
- 74 (EXIT_STORAGE) the storage failed: a bucket that does not answer at the start, or a
  checkpoint that could not be saved (the run stops there rather than train past it), each one
  line naming the bucket and the endpoint or the step; the last good checkpoint is kept, and
  the same command resumes from it once the storage is back;
- 75 (EXIT_PREEMPTED) stopped by SIGTERM (a preemption notice, a scheduler) with a checkpoint
  saved: run the same command again to resume;
- 130 stopped by Ctrl-C (SIGINT) with a checkpoint saved.
The workdir (and a separate checkpoint folder) is checked writable before any work: a small
file, an object on a bucket, is written and deleted there.
"""

import logging
import os
import sys
import threading

from bipe_jax import restore_messages
from bipe_jax import storage
from bipe_jax import storage_faults
from bipe_jax.cli import EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_STORAGE, EXIT_USER_ERROR
from bipe_jax.state import checkpointing
from bipe_jax import run_config
from bipe_jax.training import distributed
from bipe_jax.runs import workdir_lock


def library_log_name(process_index: int) -> str:
  """Each process logs to its own file: library.log (process 0), library.<i>.log."""
  return 'library.log' if process_index == 0 else f'library.{process_index}.log'


def run(config, workdir: str, *, coordinator_address: str = '', num_processes: int = 0,
        process_id: int = -1, library_log: bool = False) -> int:
  """Trains (or resumes) `config` in `workdir`; returns the process exit code.

  library_log: send library INFO logs (Orbax, TFDS) to this process's file in the workdir.
  """
  try:
    started = distributed.initialize(coordinator_address, num_processes, process_id)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  try:  # before any work: a bucket that answers, folders that take a write
    check_paths(config, workdir)
  except storage_faults.UnusablePathError as e:
    return _error(e, EXIT_USER_ERROR)
  except storage_faults.StorageUnreachableError as e:
    return _error(e, EXIT_STORAGE)
  quiet_storage_failure_noise()
  handler = None
  if library_log:
    import jax  # pylint: disable=g-import-not-at-top
    from bipe_jax.runs import run_logging  # pylint: disable=g-import-not-at-top
    from bipe_jax import storage  # pylint: disable=g-import-not-at-top
    name = library_log_name(jax.process_index() if started else 0)
    handler = run_logging.send_library_logs_to(
        storage.join(storage.absolute(workdir), name))
  try:
    return _train(config, workdir)
  finally:  # written now: at interpreter exit a bucket's client may already be gone
    if handler is not None:
      logging.getLogger().removeHandler(handler)
      handler.close()


def _error(error, code: int) -> int:
  print(f'error: {" ".join(str(error).split())}', file=sys.stderr, flush=True)
  return code


def check_paths(config, workdir: str) -> None:
  """The storage settings of the environment are valid; the workdir and a checkpoint.dir of its
  own take a write; the data and text folders on a bucket answer. UnusablePathError (a
  ValueError) / StorageUnreachableError, one line each."""
  from bipe_jax.training import trainer  # pylint: disable=g-import-not-at-top
  try:
    storage_faults.RetryPolicy.from_env()
    checkpointing.save_timeout_s()
    trainer.stop_grace_s()
  except ValueError as e:
    raise storage_faults.UnusablePathError(str(e)) from None
  storage_faults.check_writable(storage.absolute(workdir))
  checkpoint_dir = config.checkpoint.dir if 'checkpoint' in config else ''
  if checkpoint_dir:
    storage_faults.check_writable(checkpoint_dir)
  data = config.data if 'data' in config else None
  for name in ('data_dir', 'text_dir'):
    folder = data[name] if data is not None and name in data else ''
    if folder and not storage.is_local(folder):
      storage_faults.check_reachable(folder)


def quiet_storage_failure_noise() -> None:
  """When a bucket stops answering mid-run, what the libraries' background work prints goes to
  the library log instead of the terminal: the run reports the failure itself, in one line.
  - a thread that ends on it (Orbax's save threads): its traceback;
  - tensorstore's writes still in flight when Orbax has closed its event loop: each reports
    "Event loop is closed" through Python's unraisable-exception hook, or, handed back from
    tensorstore's own thread, through sys.excepthook (restore_messages.is_closed_loop_callback).
  Any other error is printed as before."""
  thread_hook, unraisable_hook, except_hook = (threading.excepthook, sys.unraisablehook,
                                               sys.excepthook)
  if getattr(thread_hook, 'quiets_storage_failures', False):
    return
  log = logging.getLogger('bipe_jax')

  def on_thread_error(args):
    if _is_storage_failure(args.exc_value):
      log.info('thread %s ended: %s', args.thread, args.exc_value,
               exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
      return
    thread_hook(args)

  def on_unraisable(unraisable):
    if str(unraisable.exc_value) == 'Event loop is closed':
      log.info('a storage operation finished after its event loop had closed')
      return
    unraisable_hook(unraisable)

  def on_uncaught(exc_type, exc_value, traceback):
    if restore_messages.is_closed_loop_callback(exc_value, traceback):
      log.info('a storage operation finished after its event loop had closed')
      return
    except_hook(exc_type, exc_value, traceback)

  on_thread_error.quiets_storage_failures = True
  threading.excepthook, sys.unraisablehook, sys.excepthook = (on_thread_error, on_unraisable,
                                                              on_uncaught)


def _is_storage_failure(error) -> bool:
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, (storage_faults.StorageUnreachableError, ConnectionError,
                          checkpointing.CheckpointSaveError)):
      return True
    error = error.__cause__ or error.__context__
  return False


def end_process(code: int):
  """Ends train/main.py with `code`. After a storage failure (EXIT_STORAGE) at once
  (os._exit, the output flushed): the libraries' exit handlers and their threads still retrying
  the bucket (Orbax's) would otherwise each wait out the retries again, and print their
  tracebacks."""
  if code == EXIT_STORAGE:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def _train(config, workdir: str) -> int:
  from bipe_jax.training import trainer  # pylint: disable=g-import-not-at-top
  try:
    result = trainer.train(config, workdir)
  except (run_config.ConfigError, checkpointing.IncompatibleCheckpointError) as e:
    print(f'config error: {e}', file=sys.stderr, flush=True)
    return 2
  except checkpointing.CheckpointsUnusableError as e:
    print(f'checkpoint error: {e}', file=sys.stderr, flush=True)
    return 2
  except (workdir_lock.WorkdirInUseError, storage.DamagedFileError) as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  except trainer.NonFiniteLossError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 1
  except (storage_faults.StorageUnreachableError, checkpointing.CheckpointSaveError) as e:
    return _error(e, EXIT_STORAGE)
  except storage_faults.UnusablePathError as e:
    return _error(e, EXIT_USER_ERROR)
  if result.stop_signal == 'SIGINT':  # Ctrl-C: saved, but the run did not finish
    return EXIT_INTERRUPTED
  if result.preempted:  # SIGTERM or JAX's preemption notice: saved, run again to resume
    return EXIT_PREEMPTED
  return 0
