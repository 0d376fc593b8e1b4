"""TensorBoard scalars, written in the training loop's own thread.

tensorboardX's SummaryWriter hands events to a background thread through a queue of ten. When a
bucket stops answering, that thread ends on its failed write, the queue fills, and the loop's
next `add_scalar` waits for ever: the run hangs instead of stopping with exit 74. Here the
events go straight to the file (a local file, or `storage.ChunkedAppender` objects on gs://),
and a failed write raises in the loop, which reports it in one line.

  events = EventFile('<workdir>/tensorboard')
  events.add_scalar('train/loss', 2.3, step=120)
  events.flush()          # written when FLUSH_INTERVAL_S have passed since the last write
  events.close()          # always written

The file is tensorboardX's (`events.out.tfevents.<time>.<host>`, tensorboardX's record
writer), so TensorBoard reads it as before.
"""

import os
import sys
import time

from bipe_jax import storage

FLUSH_INTERVAL_S = 30.0  # tensorboardX's own thread wrote every 120 s


def import_tensorboardx():
  """(EventsWriter, scalar summary, Event proto, record_writer), tensorboardX imported without
  PyTorch: tensorboardX imports torch at import time when it is installed (3-4 s of a run's
  start-up) only to accept torch tensors, which this writer never passes. A process that has
  imported torch already keeps it."""
  blocked = 'torch' not in sys.modules
  if blocked:
    sys.modules['torch'] = None  # `import torch` raises ImportError, which tensorboardX expects
  try:
    # pylint: disable=g-import-not-at-top
    from tensorboardX import record_writer
    from tensorboardX import summary
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto import event_pb2
  finally:
    if blocked:
      del sys.modules['torch']
  return EventsWriter, summary.scalar, event_pb2.Event, record_writer


class _EpathEventWriters:
  """tensorboardX writer factory for a URL scheme (gs://...): event files through
  `storage.ChunkedAppender` (tensorboardX's own gs:// writer needs google-cloud-storage)."""

  def open(self, path):
    return storage.ChunkedAppender(path, binary=True)

  def directory_check(self, path):
    storage.makedirs(path)


class EventFile:
  """One TensorBoard event file in `logdir` (local or gs://), written synchronously."""

  def __init__(self, logdir: str, *, flush_interval_s: float = FLUSH_INTERVAL_S):
    events_writer, self._scalar, self._event, record_writer = import_tensorboardx()
    if not storage.is_local(logdir):
      record_writer.register_writer_factory(logdir.split(':')[0], _EpathEventWriters())
    storage.makedirs(logdir)
    self._writer = events_writer(os.path.join(logdir, 'events'))
    self._interval = flush_interval_s
    self._flushed_at = None  # None: nothing flushed yet (the first flush writes)

  def add_scalar(self, tag: str, value: float, step: int) -> None:
    self._writer.write_event(self._event(wall_time=time.time(), step=step,
                                         summary=self._scalar(tag, value)))

  def flush(self, *, force: bool = False) -> None:
    """Writes what was added, at most once per `flush_interval_s` unless `force`."""
    now = time.monotonic()
    if force or self._flushed_at is None or now - self._flushed_at >= self._interval:
      self._writer.flush()
      self._flushed_at = now

  def close(self) -> None:
    self._writer.close()  # flushes first
