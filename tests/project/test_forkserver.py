"""tests/forkserver.py runs a Python script as a fresh interpreter would: the same exit codes,
output, environment, working directory, sys.path and timeout as subprocess.run, and a JAX
backend started with the request's XLA_FLAGS; requests it cannot serve faithfully run as plain
subprocesses."""

import os
import subprocess
import sys

import pytest

from tests import fixtures
from tests import forkserver

SCRIPT = r'''
import json, os, sys
mode = sys.argv[1]
if mode == 'state':
  print(json.dumps({'argv': sys.argv, 'cwd': os.getcwd(), 'path0': sys.path[0],
                    'path1': sys.path[1], 'var': os.environ.get('FORKSERVER_PROBE'),
                    'parent': os.getppid(), 'name': __name__, 'file': __file__}))
  print('to stderr', file=sys.stderr)
elif mode == 'exit':
  sys.exit(int(sys.argv[2]))
elif mode == 'message':
  sys.exit('a message')
elif mode == 'raise':
  raise ValueError('boom')
elif mode == 'atexit':
  import atexit, threading, time
  atexit.register(lambda: print('atexit ran', flush=True))
  threading.Thread(target=lambda: (time.sleep(0.5), print('thread finished', flush=True))).start()
elif mode == 'carriage':
  sys.stdout.write('a\r\nb\rc\n')
elif mode == 'devices':
  import jax
  print(jax.device_count())
elif mode == 'sleep':
  import time
  time.sleep(60)
'''


@pytest.fixture(name='script', scope='module')
def script_fixture(tmp_path_factory):
  path = tmp_path_factory.mktemp('forkserver') / 'probe.py'
  path.write_text(SCRIPT)
  return str(path)


def both(script, *args, **kwargs):
  """(through the fork server, as a plain subprocess)."""
  argv = [sys.executable, script, *args]
  kwargs.setdefault('timeout', 60)
  return (forkserver.run(argv, capture_output=True, text=True, **kwargs),
          subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs))


def test_process_state_is_the_requests(script, tmp_path, monkeypatch):
  import json  # pylint: disable=g-import-not-at-top
  both(script, 'exit', '0')  # the server runs from here on
  # Set in the worker by any TPU compile test before or after the server started; read by
  # libtpu when a backend starts, so the request is still forked.
  monkeypatch.setenv('ALLOW_MULTIPLE_LIBTPU_LOAD', '1' if os.environ.get(
      'ALLOW_MULTIPLE_LIBTPU_LOAD') is None else '')
  env = dict(os.environ, FORKSERVER_PROBE='x', PYTHONPATH=str(tmp_path))
  forked, plain = both(script, 'state', cwd=str(tmp_path), env=env)
  a, b = json.loads(forked.stdout), json.loads(plain.stdout)
  assert a['parent'] != os.getpid() and b['parent'] == os.getpid()  # forked by the server
  del a['parent'], b['parent']
  assert a == b
  assert a['path0'] == os.path.dirname(script) and a['path1'] == str(tmp_path)
  assert a['var'] == 'x' and a['name'] == '__main__' and a['cwd'] == str(tmp_path)
  assert forked.stderr == plain.stderr == 'to stderr\n'
  assert forked.returncode == plain.returncode == 0


@pytest.mark.parametrize('args', [('exit', '3'), ('exit', '0'), ('message',), ('raise',),
                                  ('atexit',), ('carriage',)])
def test_exit_codes_and_output_equal_a_plain_subprocess(script, args):
  forked, plain = both(script, *args)
  assert forked.returncode == plain.returncode
  assert forked.stdout == plain.stdout
  if args[0] == 'raise':  # the same traceback but for the runpy frames
    assert forked.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1] == 'ValueError: boom'
  else:
    assert forked.stderr == plain.stderr
  if args[0] == 'atexit':
    assert forked.stdout == 'thread finished\natexit ran\n'


def test_jax_starts_in_the_child_with_the_requests_device_count(script):
  forked, plain = both(script, 'devices', env=fixtures.cpu_env(4))
  assert forked.stdout == plain.stdout == '4\n', forked.stderr[-2000:]


def test_code_runs_as_with_python_c(tmp_path):
  code = 'import sys; print(sys.argv, repr(sys.path[0]), __name__); sys.exit(4)'
  argv = [sys.executable, '-c', code, 'a', 'b']
  forked = forkserver.run(argv, capture_output=True, text=True, cwd=str(tmp_path))
  plain = subprocess.run(argv, capture_output=True, text=True, cwd=str(tmp_path), check=False)
  assert (forked.returncode, forked.stdout) == (plain.returncode, plain.stdout)
  assert forked.stdout == "['-c', 'a', 'b'] '' __main__\n"


def test_a_timeout_kills_the_child(script):
  with pytest.raises(subprocess.TimeoutExpired):
    forkserver.run([sys.executable, script, 'sleep'], capture_output=True, timeout=1)


def test_a_different_startup_environment_runs_a_plain_subprocess(script):
  import json  # pylint: disable=g-import-not-at-top
  env = dict(os.environ, JAX_FORKSERVER_PROBE='1')  # a JAX_ variable: read at import
  proc = forkserver.run([sys.executable, script, 'state'], capture_output=True, env=env)
  assert json.loads(proc.stdout)['parent'] == os.getpid()


def test_a_child_follows_the_requests_storage_emulator(tmp_path):
  """bipe_jax.storage, imported by the server, points the other GCS clients at
  STORAGE_EMULATOR_HOST when imported: a forked child gets what a fresh import would set."""
  code = ('import os, bipe_jax.storage; print(os.environ.get("TENSORSTORE_GCS_HTTP_URL"), '
          'os.environ.get("CLOUD_STORAGE_EMULATOR_ENDPOINT"))')
  env = dict(fixtures.cpu_env(), STORAGE_EMULATOR_HOST='127.0.0.1:9')
  for name in ('TENSORSTORE_GCS_HTTP_URL', 'CLOUD_STORAGE_EMULATOR_ENDPOINT'):
    env.pop(name, None)
  argv = [sys.executable, '-c', code]
  forked = forkserver.run(argv, capture_output=True, text=True, cwd=str(tmp_path), env=env)
  plain = subprocess.run(argv, capture_output=True, text=True, cwd=str(tmp_path), env=env,
                         check=False)
  assert forked.stdout == plain.stdout == 'http://127.0.0.1:9 http://127.0.0.1:9\n', (
      forked.stderr[-2000:])
