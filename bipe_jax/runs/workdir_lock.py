"""One training process per workdir: an advisory lock held for the whole run.

Two trainings in one workdir (the same command started twice, a rerun while an earlier run is
still going) would interleave their checkpoints, metrics.jsonl and TensorBoard events without an
error. `hold(workdir)` takes an exclusive `flock` on `<workdir>/.train.lock` and writes who holds
it; a second holder gets `WorkdirInUseError` naming the first. The kernel drops the lock when its
process ends in any way (kill -9 included), so there is no stale lock to clean up; the file itself
stays and only says who held it last.

Only local paths are locked: on a remote filesystem (`gs://...`) flock does not exist, so the
lock is skipped with a one-line notice on stderr. On multi-host runs only process 0 takes it
(the others write no run files).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import socket
import sys

from bipe_jax import storage

LOCK_FILE = '.train.lock'


class WorkdirInUseError(RuntimeError):
  """Another training process holds the workdir's lock; the message names it."""


def _holder_text() -> str:
  now = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')
  return f'pid {os.getpid()} on {socket.gethostname()}, since {now}'


@contextlib.contextmanager
def hold(workdir: str, *, enabled: bool = True):
  """Holds `workdir`'s training lock for the `with` block (creates the workdir if needed).

  Raises WorkdirInUseError, writing nothing, when another process (or another `hold` in this
  one) holds it.
  """
  if not enabled:
    yield
    return
  if not storage.is_local(workdir):
    print(f'{workdir}: not a local folder, so the one-training-per-workdir lock is skipped '
          '(start one training per workdir)', file=sys.stderr)
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 4096, 0).decode('utf-8', 'replace').strip() or 'unknown process'
      raise WorkdirInUseError(
          f'{workdir} is being trained by another process ({holder}); wait for it to end or '
          'stop it, or train in another workdir') from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, (_holder_text() + '\n').encode('utf-8'), 0)
    try:
      yield
    finally:
      fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)
