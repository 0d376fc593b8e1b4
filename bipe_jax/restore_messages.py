"""What a recovery from a damaged checkpoint prints: one line per damaged step, one for the step
used, and none of the noise a failed Orbax / TensorStore read leaves behind.

A failed read raises an error whose text embeds a whole TensorStore spec, logs it through
Orbax's and asyncio's Python loggers, and abandons read coroutines whose event loop is closed
later ("Event loop is closed" / "coroutine ... was never awaited", or the read's own error
raised in a coroutine nobody awaits: printed by Python's unraisable-exception hook, possibly at
exit; or, when TensorStore's read thread finds the loop closed as it hands a result back, a bare
"Traceback ... call_soon_threadsafe ... RuntimeError: Event loop is closed" printed through
`sys.excepthook`). `short_reason` keeps the error's first words, `quiet_failed_reads` silences
those loggers while the restores are tried and drops those messages from then on (any other
unraisable or uncaught exception is still printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys

NOISY_LOGGERS = ('asyncio', 'absl', 'orbax', 'orbax.checkpoint', 'tensorstore', 'jax')
# What Python's unraisable hook reports for the reads abandoned by a failed restore: their closed
# event loop, a coroutine never awaited, or the read's own error raised in a coroutine that
# nobody awaits any more (Orbax's `_read_array_index_and_device_put`: "Exception ignored in:
# <coroutine ...>" with the whole TensorStore spec, once per array of the damaged step), or
# TensorStore's own read error left in a future nobody retrieves (asyncio's "Future exception was
# never retrieved ... OUT_OF_RANGE: Error reading "<array>" in OCDBT database ...").
ABANDONED_READ_MESSAGES = ('Event loop is closed', 'was never awaited',
                           'Encountered error while reading array index',
                           'in OCDBT database at')
_CUT_AT = ('See full TensorStore details', 'tensorstore_spec', '\n')


def short_reason(error: BaseException, limit: int = 200) -> str:
  """'ExceptionType: the first words of its message' without TensorStore's spec dump."""
  text = str(error)
  for marker in _CUT_AT:
    if marker in text:
      text = text[:text.index(marker)]
  text = ' '.join(text.split()).rstrip(' .:')
  if len(text) > limit:
    text = text[:limit].rstrip() + '...'
  return f'{type(error).__name__}: {text}' if text else type(error).__name__


def _drop_abandoned_reads(previous):
  def hook(unraisable):
    text = f'{unraisable.exc_value!r} {unraisable.err_msg or ""}'
    if any(m in text for m in ABANDONED_READ_MESSAGES):
      return
    previous(unraisable)
  hook.drops_abandoned_reads = True
  return hook


_ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep


def is_closed_loop_callback(exc_value, traceback) -> bool:
  """The error of a read's result handed to a closed event loop from TensorStore's thread: an
  'Event loop is closed' whose whole traceback lies inside asyncio (no Python caller: it was
  called from C). The same error raised through a script's own frames is not this."""
  if not isinstance(exc_value, RuntimeError) or str(exc_value) != 'Event loop is closed':
    return False
  while traceback is not None:
    if not traceback.tb_frame.f_code.co_filename.startswith(_ASYNCIO_DIR):
      return False
    traceback = traceback.tb_next
  return True


def _drop_closed_loop_callbacks(previous):
  def hook(exc_type, exc_value, traceback):
    if is_closed_loop_callback(exc_value, traceback):
      return
    previous(exc_type, exc_value, traceback)
  hook.drops_abandoned_reads = True
  return hook


class _AbandonedReadRecords(logging.Filter):
  """Drops asyncio's "Task exception was never retrieved" for an abandoned read (logged when the
  task is garbage-collected, after the restores were tried)."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    return not any(m in text for m in ABANDONED_READ_MESSAGES)


def install_unraisable_filter() -> None:
  """From now on, an abandoned read's 'Event loop is closed' / 'never awaited' / read error is
  not printed: neither by the unraisable hook, nor by the exception hook (a closed loop met from
  TensorStore's thread), nor by asyncio's logger."""
  if not getattr(sys.unraisablehook, 'drops_abandoned_reads', False):
    sys.unraisablehook = _drop_abandoned_reads(sys.unraisablehook)
  if not getattr(sys.excepthook, 'drops_abandoned_reads', False):
    sys.excepthook = _drop_closed_loop_callbacks(sys.excepthook)
  asyncio_logger = logging.getLogger('asyncio')
  if not any(isinstance(f, _AbandonedReadRecords) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_AbandonedReadRecords())


@contextlib.contextmanager
def quiet_failed_reads():
  """Silences the libraries' loggers while checkpoints are tried (our own lines are printed).
  The hooks go in first: a failed read's thread can report its closed loop before the restore
  call has raised."""
  install_unraisable_filter()
  loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
  levels = [logger.level for logger in loggers]
  for logger in loggers:
    logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    for logger, level in zip(loggers, levels):
      logger.setLevel(level)


def damaged_line(step: int, directory: str, error: BaseException, action: str) -> str:
  return (f'WARNING: checkpoint step {step} in {directory} is damaged ({short_reason(error)}); '
          f'{action}')


def used_line(step: int) -> str:
  return f'using checkpoint step {step}, the newest that restores'
