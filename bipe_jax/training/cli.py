"""What `train/main.py` runs: start the distributed runtime, train, turn errors into one line.

Exit codes: 0 done (or preempted by SIGTERM with a checkpoint saved), 1 non-finite loss, 2 bad
config, unusable checkpoint, or a workdir another process is training in, 130 stopped by Ctrl-C
(SIGINT) with a checkpoint saved.
"""

import logging
import sys

from bipe_jax import storage
from bipe_jax.cli import EXIT_INTERRUPTED
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
  if result.stop_signal == 'SIGINT':  # Ctrl-C: saved, but the run did not finish
    return EXIT_INTERRUPTED
  return 0
