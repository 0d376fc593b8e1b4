"""A recovery from a damaged checkpoint prints one short line per damaged step, one for the step
used, and none of the noise of the failed reads (TensorStore spec dumps, closed event loops)."""

import asyncio
import logging
import sys
import threading
import types

from bipe_jax import restore_messages


def test_the_reason_keeps_the_first_words_without_the_tensorstore_dump():
  error = ValueError('Encountered error while reading array index: (slice(0, 4, 1),). See full '
                     'TensorStore details: <bound method spec of TensorStore({"driver": "zarr", '
                     + 'x' * 5000 + '})>\nmore lines')
  assert restore_messages.short_reason(error) == (
      'ValueError: Encountered error while reading array index: (slice(0, 4, 1),)')
  assert restore_messages.short_reason(OSError('y' * 500)).endswith('y...')
  assert restore_messages.short_reason(KeyError()) == 'KeyError'
  line = restore_messages.damaged_line(6, '/r/checkpoints', error, 'trying the previous one')
  assert line.startswith('WARNING: checkpoint step 6 in /r/checkpoints is damaged (ValueError')
  assert '\n' not in line and restore_messages.used_line(4).startswith('using checkpoint step 4')


def test_abandoned_reads_are_dropped_and_other_unraisables_kept(monkeypatch):
  seen = []
  monkeypatch.setattr(sys, 'unraisablehook', seen.append)
  restore_messages.install_unraisable_filter()
  restore_messages.install_unraisable_filter()  # once is enough: not wrapped twice
  assert sys.unraisablehook.drops_abandoned_reads
  event = lambda exc, msg='Exception ignored in': types.SimpleNamespace(  # pylint: disable=unnecessary-lambda-assignment
      exc_value=exc, err_msg=msg)
  sys.unraisablehook(event(RuntimeError('Event loop is closed')))
  sys.unraisablehook(event(RuntimeWarning("coroutine 'read' was never awaited")))
  sys.unraisablehook(event(Exception('Encountered error while reading array index: (slice(0, '
                                     '32, 1),). See full TensorStore details: ...')))
  kept = event(ValueError('a real problem'))
  sys.unraisablehook(kept)
  assert seen == [kept]


def test_asyncio_reports_of_abandoned_reads_are_dropped_and_others_kept(caplog):
  restore_messages.install_unraisable_filter()
  caplog.set_level(logging.ERROR)
  log = logging.getLogger('asyncio')
  log.error('Task exception was never retrieved\nfuture: <Task exception=Exception("Encountered '
            'error while reading array index: (slice(0, 32, 1),). See full TensorStore")>')
  log.error('Future exception was never retrieved\nfuture: <Future finished exception=ValueError('
            '\'OUT_OF_RANGE: Error reading "opt_state.mu.kernel/0.0" in OCDBT database at local '
            'file "/r/checkpoints/4/state/": Requested byte range [0, 9) is not valid\')>')
  log.error('Task exception was never retrieved\nfuture: <Task exception=ValueError("real")>')
  assert [r.getMessage()[-14:] for r in caplog.records] == ['ValueError("real")>'[-14:]]


def test_the_libraries_loggers_are_silent_while_restores_are_tried(caplog):
  caplog.set_level(logging.WARNING)
  with restore_messages.quiet_failed_reads():
    logging.getLogger('asyncio').error('Task exception was never retrieved')
    logging.getLogger('orbax.checkpoint').error('restore failed: <TensorStore spec>')
  logging.getLogger('asyncio').warning('after the restores')
  assert [r.getMessage() for r in caplog.records] == ['after the restores']


def _closed_loop_errors():
  """(as called from C: only asyncio's frames, with its traceback; raised through this test's
  frames, with its traceback): a real closed event loop's `call_soon_threadsafe` error."""
  loop = asyncio.new_event_loop()
  loop.close()
  errors = []
  for _ in range(2):
    try:
      loop.call_soon_threadsafe(print)
    except RuntimeError as e:
      errors.append(e)
  assert len(errors) == 2
  inside_asyncio = errors[0].__traceback__  # this test's frame dropped: as if called from C
  while 'asyncio' not in inside_asyncio.tb_frame.f_code.co_filename:
    inside_asyncio = inside_asyncio.tb_next
  return (errors[0], inside_asyncio), (errors[1], errors[1].__traceback__)


def test_a_closed_loop_met_from_a_read_thread_is_dropped_and_a_scripts_own_kept(monkeypatch):
  """TensorStore's thread hands a read's result to a loop Orbax has closed: the error, raised in
  asyncio's `call_soon_threadsafe` with no Python caller, reaches `sys.excepthook` (PyErr_Print)
  as a bare traceback. That one is dropped; the same error raised through a script's frames, and
  any other error, still print."""
  seen = []
  monkeypatch.setattr(sys, 'excepthook', lambda *exc: seen.append(exc[1]))
  restore_messages.install_unraisable_filter()
  restore_messages.install_unraisable_filter()
  from_c, from_script = _closed_loop_errors()
  for error, traceback in (from_c, from_script):
    sys.excepthook(type(error), error, traceback)
  other = ValueError('a real problem')
  sys.excepthook(ValueError, other, None)
  assert seen == [from_script[0], other]


def test_a_run_failing_on_storage_logs_the_closed_loop_and_prints_the_rest(monkeypatch, caplog):
  """The training CLI's hooks for a bucket that stops answering (cli.quiet_storage_failure_noise)
  send the same closed-loop error of a write in flight to the library log, not the terminal."""
  from bipe_jax.training import cli  # pylint: disable=g-import-not-at-top
  seen = []
  monkeypatch.setattr(sys, 'excepthook', lambda *exc: seen.append(exc[1]))
  monkeypatch.setattr(sys, 'unraisablehook', sys.__unraisablehook__)
  monkeypatch.setattr(threading, 'excepthook', threading.__excepthook__)  # not yet installed
  caplog.set_level(logging.INFO, logger='bipe_jax')
  cli.quiet_storage_failure_noise()
  from_c, from_script = _closed_loop_errors()
  for error, traceback in (from_c, from_script):
    sys.excepthook(type(error), error, traceback)
  assert seen == [from_script[0]]
  assert any('after its event loop had closed' in r.getMessage() for r in caplog.records)
