"""When storage fails: bounded retries, one line naming the bucket and the endpoint, and the
checks a command makes before any work.

Bounded retries. Every request a run makes to a bucket is tried at most `RetryPolicy.attempts`
times, waiting `first_wait_s`, then twice as long, between tries; then it fails with
`StorageUnreachableError`, one line naming the bucket, the endpoint and the last error:
- gcsfs (every file of bipe_jax.storage on gs://): `bipe_jax.storage_gcs.BoundedGCSFileSystem`,
  which bipe_jax.storage binds to gs://, replaces gcsfs's own retries (6 tries, up to 63 s per
  request, and a traceback logged for each request that runs out of them);
- Orbax's tensorstore (the checkpoints' arrays): `tensorstore_retries()`, the context resource
  bipe_jax.state.checkpointing gives Orbax (tensorstore's own default: 32 retries with waits of
  up to 32 s, a quarter of an hour per request).
The bounds come from the environment, read at each request (so a test can shorten them):
  BIPE_JAX_STORAGE_ATTEMPTS      tries per request (default 4: waits of 1, 2 and 4 s)
  BIPE_JAX_STORAGE_RETRY_WAIT_S  the first wait, doubled after each try (default 1)
  BIPE_JAX_STORAGE_TIMEOUT_S     how long a connection may take to open (default 10)

Checks before any work (`check_reachable`, `check_writable`, `check_output_file`): a bucket that
does not answer is `StorageUnreachableError` (a command exits with bipe_jax.cli.EXIT_STORAGE,
74), a bucket that does not exist or a folder that takes no write is `UnusablePathError` (a
ValueError: a user's mistake, exit 2), each one line. A folder is probed by writing and deleting
a small file (an object on a bucket) in it.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

DEFAULT_ENDPOINT = 'https://storage.googleapis.com'
ATTEMPTS_ENV = 'BIPE_JAX_STORAGE_ATTEMPTS'
WAIT_ENV = 'BIPE_JAX_STORAGE_RETRY_WAIT_S'
TIMEOUT_ENV = 'BIPE_JAX_STORAGE_TIMEOUT_S'
PROBE_PREFIX = '.bipe_jax_write_probe'


class StorageUnreachableError(Exception):
  """A bucket that did not answer within the retry bound; the message is one line naming the
  bucket and the endpoint. Not an OSError: fsspec reads an OSError from `isdir` as "no such
  folder", and a run must never take an unreachable bucket for an empty one."""


class UnusablePathError(ValueError):
  """A path a command cannot use: no such bucket, a folder that takes no write, an output that
  is a folder. One line naming the path."""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
  attempts: int = 4
  first_wait_s: float = 1.0
  connect_timeout_s: float = 10.0

  @classmethod
  def from_env(cls, environ=None) -> 'RetryPolicy':
    """The policy the environment sets (module docstring); a bad value is a one-line
    ValueError naming the variable."""
    environ = os.environ if environ is None else environ
    values = {}
    for field, name, kind, low in (('attempts', ATTEMPTS_ENV, int, 1),
                                   ('first_wait_s', WAIT_ENV, float, 0.0),
                                   ('connect_timeout_s', TIMEOUT_ENV, float, 0.001)):
      text = environ.get(name, '').strip()
      if not text:
        continue
      try:
        value = kind(text)
      except ValueError:
        value = None
      if value is None or value < low:
        raise ValueError(f'{name}={text!r}: must be a {kind.__name__} >= {low}')
      values[field] = value
    return cls(**values)

  def wait(self, attempt: int) -> float:
    """Seconds to wait after the failed try number `attempt` (0-based)."""
    return self.first_wait_s * 2 ** attempt

  def budget_s(self) -> float:
    """The longest the waits between tries of one request add up to."""
    return sum(self.wait(a) for a in range(self.attempts - 1))


def tensorstore_retries(policy: RetryPolicy | None = None) -> dict:
  """tensorstore's `gcs_request_retries` context resource for `policy` (default: the
  environment's): as many tries, the same first wait, doubling up to the last one."""
  policy = policy or RetryPolicy.from_env()
  return {'max_retries': policy.attempts, 'initial_delay': f'{policy.first_wait_s:g}s',
          'max_delay': f'{policy.wait(max(policy.attempts - 2, 0)):g}s'}


def endpoint(environ=None) -> str:
  """The GCS endpoint requests go to: STORAGE_EMULATOR_HOST (an emulator), else Google's."""
  environ = os.environ if environ is None else environ
  host = environ.get('STORAGE_EMULATOR_HOST', '').strip()
  if not host:
    return DEFAULT_ENDPOINT
  return host if '://' in host else f'http://{host}'


def split_url(path: str) -> tuple[str, str, str]:
  """'gs://bucket/a/b' -> ('gs', 'bucket', 'a/b')."""
  scheme, rest = os.fspath(path).split('://', 1)
  bucket, _, key = rest.partition('/')
  return scheme, bucket, key.strip('/')


def unreachable(bucket: str, reason: BaseException | str, policy: RetryPolicy | None = None
                ) -> StorageUnreachableError:
  """The one-line error for `bucket` (a name, or a gs:// URL) that did not answer."""
  policy = policy or RetryPolicy.from_env()
  name = bucket if '://' in bucket else f'gs://{bucket}'
  text = ' '.join(str(reason).split()) or type(reason).__name__
  return StorageUnreachableError(
      f'storage unreachable: {name} at {endpoint()} did not answer in {policy.attempts} tries '
      f'over {policy.budget_s():.0f} s ({text})')


def _gcs_filesystem(scheme: str):
  import fsspec  # pylint: disable=g-import-not-at-top
  from bipe_jax import storage  # pylint: disable=g-import-not-at-top  (binds gs:// first)
  del storage
  return fsspec.filesystem(scheme)


_REACHED: set = set()  # buckets that answered in this process


def check_reachable(path) -> None:
  """Nothing for a local path or a bucket that answers (asked once per process: one listing of
  at most one object under the path); StorageUnreachableError when it does not answer within
  the retry bound, UnusablePathError when there is no such bucket."""
  path = os.fspath(path)
  if '://' not in path:
    return
  scheme, bucket, key = split_url(path)
  if (scheme, bucket) in _REACHED:
    return
  fs = _gcs_filesystem(scheme)
  if not hasattr(fs, 'call'):  # not gcsfs (a test's in-memory store): nothing to ask
    return
  try:
    fs.call('GET', 'b/{}/o', bucket, prefix=key, maxResults=1, json_out=True)
  except FileNotFoundError:
    raise UnusablePathError(f'{path}: no bucket {bucket!r} at {endpoint()}') from None
  except StorageUnreachableError:
    raise
  except OSError as e:  # 403: the account may not list the bucket
    raise UnusablePathError(f'{path}: {" ".join(str(e).split())}') from None
  _REACHED.add((scheme, bucket))


def _probe_name() -> str:
  return f'{PROBE_PREFIX}.{socket.gethostname()}.{os.getpid()}.{time.monotonic_ns()}'


def _existing_ancestor(folder: str) -> str:
  """`folder` itself or its nearest ancestor that exists (local paths)."""
  path = os.path.abspath(folder)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def check_writable(folder) -> None:
  """`folder` takes a write: a small file (an object on a bucket) is written and deleted in
  it, or, for a local folder not yet made, in its nearest existing ancestor (nothing is left
  behind). UnusablePathError (one line) when not; StorageUnreachableError for a bucket that
  does not answer."""
  folder = os.fspath(folder)
  if '://' not in folder:
    where = _existing_ancestor(folder)
    if not os.path.isdir(where):
      raise UnusablePathError(f'{folder} is not a writable folder ({where} is a file)')
    probe = os.path.join(where, _probe_name())
    try:
      with open(probe, 'wb') as f:
        f.write(b'probe')
      os.remove(probe)
    except OSError as e:
      reason = e.strerror or type(e).__name__
      place = '' if where == os.path.abspath(folder) else f' (in {where})'
      raise UnusablePathError(f'{folder} is not a writable folder: {reason}{place}') from None
    return
  check_reachable(folder)
  scheme, bucket, key = split_url(folder)
  probe = f'{bucket}/{key + "/" if key else ""}{_probe_name()}'
  fs = _gcs_filesystem(scheme)
  try:
    fs.pipe_file(probe, b'probe')
    fs.rm_file(probe)
  except StorageUnreachableError:
    raise
  except OSError as e:  # 403 Forbidden
    raise UnusablePathError(f'{folder} is not writable ({" ".join(str(e).split())})') from None


def check_output_file(path) -> None:
  """The file `path` can be written: not a folder, its folder writable (`check_writable`).
  Nothing for '' (no output)."""
  path = os.fspath(path)
  if not path:
    return
  if '://' not in path and os.path.isdir(path):
    raise UnusablePathError(f'{path} is a folder, not a file to write')
  folder = os.path.dirname(path.rstrip('/')) or '.'
  if '://' in path and folder.endswith(':/'):
    raise UnusablePathError(f'{path}: give a file in a bucket (gs://bucket/file)')
  try:
    check_writable(folder)
  except UnusablePathError as e:
    raise UnusablePathError(f'cannot write {path}: {e}') from None
