"""Where library log lines go: INFO to a run's log file, warnings and errors also to stderr.

A run's terminal shows its own progress and results; the INFO lines of absl, Orbax, TFDS and
this library (hundreds per run: checkpoint saves and restores, dataset preparation) go to a
log file beside the run. `send_library_logs_to(path)` sets that up for the Python `logging`
root logger, which absl, Orbax and TFDS all write through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from bipe_jax import storage

_FORMAT = '%(asctime)s %(levelname)s %(name)s: %(message)s'
# Library warnings that say nothing to a person watching the run: the file only.
# TFDS warns 'Using custom data configuration' for every BuilderConfig made at run time, which
# is how the embedded corpus and text folders are built.
QUIET_WARNINGS = ('Using custom data configuration',)
FLUSH_INTERVAL_S = 10.0  # a log on an object store is written at most this often
STORAGE_UNREACHABLE = 'storage unreachable:'  # how bipe_jax.storage_faults's errors begin


class _KnownNoise(logging.Filter):

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.getMessage()).startswith(QUIET_WARNINGS)


class _FileOnly(logging.Filter):
  """Keeps off the terminal what a run with a log file reports itself: a library's traceback
  (Orbax logs one for each failed save, several threads' worth when a bucket stops answering),
  and its lines about a bucket that does not answer (the run stops with one line naming it)."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.exc_info and record.exc_info[0] is not None:
      return False
    return STORAGE_UNREACHABLE not in str(record.getMessage())


class _FileHandlerMadeOnFirstLine(logging.FileHandler):
  """Creates its file (and folder) when the first line arrives: a run refused at start leaves
  no log file behind."""

  def _open(self):
    os.makedirs(os.path.dirname(self.baseFilename), exist_ok=True)
    return super()._open()


class _ObjectLogHandler(logging.StreamHandler):
  """The log file of a workdir on an object store (gs://...), through etils.epath: appended in
  parts (`storage.ChunkedAppender`), the last part written at most every
  `FLUSH_INTERVAL_S` seconds, at each warning or error, and when the handler closes.

  A write that fails (the bucket stopped answering) stops the writing: each later line would
  wait out the storage retries again, under the logging lock every thread shares. The lines
  still come in and are written once more at `close`; if that fails too, one warning says so.
  """

  def __init__(self, path: str):
    super().__init__(storage.ChunkedAppender(path, min_interval_s=FLUSH_INTERVAL_S))
    self._failed = None  # the error of the write that failed
    self._closed = False

  def emit(self, record):
    try:
      self.stream.write(self.format(record) + self.terminator)
      if self._failed is None:
        self.stream.flush(force=record.levelno >= logging.WARNING)
    except Exception as e:  # pylint: disable=broad-except
      self._failed = e

  def flush(self):
    pass  # written by `emit` (at most every FLUSH_INTERVAL_S) and by `close`

  def close(self):
    self.acquire()
    try:
      if not self._closed:
        self._closed = True
        self.stream.close()
    except Exception as e:  # pylint: disable=broad-except  (the bucket unreachable: say so)
      print(f'warning: the last lines of {self.stream.path} were not written: '
            f'{" ".join(str(e).split())}', file=sys.stderr, flush=True)
    finally:
      self.release()
    super().close()


def filter_known_noise() -> None:
  """Keeps the `QUIET_WARNINGS` lines off absl's stderr handler (a CLI without a log file)."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.get_absl_handler().addFilter(_KnownNoise())


def send_library_logs_to(path: str, *, level: int = logging.INFO) -> logging.Handler:
  """INFO and above to the file `path` (appended, created with its folder at the first line);
  the terminal keeps
  WARNING and above only. Returns the file handler (call `handler.close()` to detach it)."""
  root = logging.getLogger()
  consoles = [h for h in root.handlers
              if not isinstance(h, (logging.FileHandler, _ObjectLogHandler))]
  for handler in consoles:  # absl's stderr handler and any other console handler
    handler.setLevel(max(handler.level, logging.WARNING))
    handler.addFilter(_KnownNoise())
    handler.addFilter(_FileOnly())
  if not consoles:  # without any, warnings would now reach the file only
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    console.addFilter(_KnownNoise())
    console.addFilter(_FileOnly())
    root.addHandler(console)
  try:
    from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
    absl_logging.set_verbosity(absl_logging.INFO)
    absl_logging.get_absl_handler().setLevel(logging.WARNING)
    absl_logging.get_absl_handler().addFilter(_KnownNoise())
    absl_logging.get_absl_handler().addFilter(_FileOnly())
  except ImportError:  # absl is a dependency of JAX, but the function does not need it
    pass
  root.setLevel(min(root.level or level, level))
  if not storage.is_local(path):  # a bucket
    file_handler = _ObjectLogHandler(path)
  else:
    file_handler = _FileHandlerMadeOnFirstLine(path, encoding='utf-8', delay=True)
  file_handler.setLevel(level)
  file_handler.setFormatter(logging.Formatter(_FORMAT))
  root.addHandler(file_handler)
  return file_handler


@contextlib.contextmanager
def info_lines_dropped():
  """Drops INFO and lower lines inside the block (Orbax announces each checkpoint handler it
  makes at INFO): checks made before a run may write anything must not create its log file."""
  before = logging.root.manager.disable
  logging.disable(max(before, logging.INFO))
  try:
    yield
  finally:
    logging.disable(before)
