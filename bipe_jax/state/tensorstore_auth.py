"""Tensorstore's credentials line kept off the terminal.

Against a GCS emulator (STORAGE_EMULATOR_HOST: bipe_jax.storage.follow_storage_emulator sets
GOOGLE_AUTH_TOKEN_FOR_TESTING for tensorstore), tensorstore's C++ logging writes
`I... google_auth_provider.cc:136] Using GOOGLE_AUTH_TOKEN_FOR_TESTING` straight to the process's
stderr (file descriptor 2) the first time it builds its credentials: once per process, in the
middle of a command's output. Its own absl logging takes no setting from Python
(`tensorstore.parse_tensorstore_flags(['--minloglevel=1'])` leaves the line), so
`start_quietly(path)` builds the credentials itself before Orbax's first request, with file
descriptor 2 pointed at a temporary file for that moment: the line goes to the library log
(Python logging at INFO: a training run's library.log), anything else written then goes back to
stderr unchanged.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time

TOKEN_ENV = 'GOOGLE_AUTH_TOKEN_FOR_TESTING'
TOKEN_LINE = 'Using GOOGLE_AUTH_TOKEN_FOR_TESTING'
WAIT_S = 2.0  # the line comes as the first request is built, before any answer
PROBE_KEY = '.bipe_jax_credentials_probe'  # read (absent: a 404), never written

_started = False


def _bucket(path: str) -> str | None:
  text = os.fspath(path)
  if not text.startswith('gs://'):
    return None
  return text[len('gs://'):].split('/', 1)[0] or None


def start_quietly(path, *, wait_s: float = WAIT_S) -> bool:
  """Builds tensorstore's GCS credentials (once per process) with the token line sent to the
  library log; a no-op for a local path, without the test token (real GCS: no such line) or
  after the first call. Returns whether it probed."""
  global _started
  bucket = _bucket(path)
  if _started or bucket is None or not os.environ.get(TOKEN_ENV):
    return False
  _started = True
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as capture:
    os.dup2(capture.fileno(), 2)
    future = None
    try:
      context = ts.Context({'gcs_request_retries': {'max_retries': 1}})
      store = ts.KvStore.open({'driver': 'gcs', 'bucket': bucket}, context=context).result()
      future = store.read(PROBE_KEY)
      deadline = time.monotonic() + wait_s
      while time.monotonic() < deadline and not future.done():
        capture.seek(0)
        if TOKEN_LINE.encode() in capture.read():
          break
        time.sleep(0.01)
    except Exception:  # pylint: disable=broad-except  (the real request reports a real fault)
      pass
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      if future is not None and not future.done():
        future.cancel()
    capture.seek(0)
    text = capture.read().decode('utf-8', errors='replace')
  others = []
  for line in text.splitlines():
    if TOKEN_LINE in line:
      logging.getLogger('tensorstore').info('%s', line.strip())
    else:
      others.append(line)
  if others:
    print('\n'.join(others), file=sys.stderr, flush=True)
  return True
