"""tests/gcs_server.py's fake-gcs-server answers what the runs ask of GCS: a suffix range read
of an object over 1 MiB (array_record opens a record file at its end), the generation header
(tensorstore, Orbax's checkpoints) and objects that survive a kill and a restart."""

# pylint: disable=redefined-outer-name  (the fixture gcs_server, imported)
import os
import urllib.request

from tests import gcs_server as gcs
from tests.gcs_server import gcs_server  # noqa: F401  pylint: disable=unused-import


def _get(server, name: str, headers: dict):
  url = f'{server.url}/download/storage/v1/b/{server.bucket}/o/{name}?alt=media'
  return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)


def test_suffix_range_read_of_a_large_object_and_its_generation(gcs_server):
  server = gcs_server
  data = os.urandom(3 * 2**20 + 17)
  server.fs.pipe(f'{server.bucket}/big.bin', data)
  with _get(server, 'big.bin', {'Range': 'bytes=-100'}) as response:
    assert response.status == 206 and response.read() == data[-100:]
    assert int(response.headers['x-goog-generation']) > 0


def test_objects_survive_a_kill_and_a_restart_on_the_same_port(gcs_server):
  server = gcs_server
  server.fs.pipe(f'{server.bucket}/run/a.json', b'{}')
  url = server.url
  server.kill()
  assert not server.alive
  assert server.env()['STORAGE_EMULATOR_HOST'] == url
  server.restart()
  assert server.url == url and server.objects() == {'run/a.json'}
  assert server.fs.cat(f'{server.bucket}/run/a.json') == b'{}'


def test_env_points_only_at_this_server():
  base = {'PATH': '/bin', 'TENSORSTORE_GCS_HTTP_URL': 'http://elsewhere:1',
          'CLOUD_STORAGE_EMULATOR_ENDPOINT': 'http://elsewhere:1'}
  fake = gcs.FakeGcsServer('/nonexistent/root', port=12345)  # not started
  assert fake.env(base, X='1') == {'PATH': '/bin', 'X': '1',
                                   'STORAGE_EMULATOR_HOST': 'http://127.0.0.1:12345'}
