"""Library INFO lines go to the run's log file; the terminal keeps warnings and errors."""

import os
import subprocess
import sys

import pytest

from bipe_jax.runs import run_logging
from tests import fixtures

ROOT = fixtures.ROOT

SCRIPT = '''
import logging, sys
from absl import logging as absl_logging
from bipe_jax.runs import run_logging
run_logging.send_library_logs_to(sys.argv[1])
logging.getLogger('orbax').info('orbax restored step 7')
absl_logging.info('absl info line')
logging.getLogger('tfds').warning('a warning everyone should see')
print('progress line')
'''


def test_info_to_the_file_warnings_to_both(tmp_path):
  log = tmp_path / 'run' / 'library.log'
  proc = subprocess.run([sys.executable, '-c', SCRIPT, str(log)], cwd=ROOT, capture_output=True,
                        text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == 'progress line\n'
  assert 'a warning everyone should see' in proc.stderr
  assert 'orbax restored step 7' not in proc.stderr and 'absl info line' not in proc.stderr
  text = log.read_text()
  for line in ('orbax restored step 7', 'absl info line', 'a warning everyone should see'):
    assert line in text


def test_quiet_library_logs_keeps_info_off_unless_verbosity_given(monkeypatch):
  from absl import flags
  from absl import logging as absl_logging
  from bipe_jax import cli
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(['prog'])
  before = absl_logging.get_verbosity()
  try:
    monkeypatch.setattr(flags.FLAGS['verbosity'], 'present', 0)
    absl_logging.set_verbosity(absl_logging.INFO)
    cli.quiet_library_logs()
    assert absl_logging.get_verbosity() == absl_logging.WARNING
    monkeypatch.setattr(flags.FLAGS['verbosity'], 'present', 1)  # --verbosity given: kept
    absl_logging.set_verbosity(absl_logging.INFO)
    cli.quiet_library_logs()
    assert absl_logging.get_verbosity() == absl_logging.INFO
  finally:
    absl_logging.set_verbosity(before)


TOKEN_SCRIPT = '''
import sys
import jax.numpy as jnp
from bipe_jax.runs import run_logging
from bipe_jax.state import checkpointing
run_logging.send_library_logs_to(sys.argv[2])
if sys.argv[3] == 'checkpointer':  # what every gs:// command does: Orbax through Checkpointer
  ckpt = checkpointing.Checkpointer(sys.argv[1], async_save=False)
  ckpt.save(1, {'w': jnp.arange(3.0)}, {'position': 1}, force=True)
  ckpt.close()
else:  # tensorstore alone, as before: its credentials line straight to file descriptor 2
  import tensorstore as ts
  bucket = sys.argv[1][len('gs://'):].split('/')[0]
  ts.KvStore.open({'driver': 'gcs', 'bucket': bucket}).result().read('absent').result()
print('done')
'''


def test_tensorstores_emulator_token_line_goes_to_the_log_not_the_terminal(tmp_path):
  """Against fake-gcs-server a checkpoint save in gs:// prints no `Using
  GOOGLE_AUTH_TOKEN_FOR_TESTING` line (tensorstore's C++ log, written to stderr directly): it
  is in the library log. Tensorstore used without bipe_jax.state.tensorstore_auth does print
  it (the check below could not pass by the line being gone)."""
  from tests import gcs_server  # pylint: disable=g-import-not-at-top
  line = 'Using GOOGLE_AUTH_TOKEN_FOR_TESTING'
  with gcs_server.FakeGcsServer(tmp_path / 'gcs') as server:
    outputs = {}
    for mode in ('checkpointer', 'tensorstore'):
      log = tmp_path / mode / 'library.log'
      proc = subprocess.run(
          [sys.executable, '-c', TOKEN_SCRIPT, f'gs://{server.bucket}/ck', str(log), mode],
          cwd=ROOT, env=server.env(fixtures.cpu_env()), capture_output=True, text=True,
          timeout=120)
      assert proc.returncode == 0 and proc.stdout == 'done\n', proc.stderr[-3000:]
      outputs[mode] = (proc.stderr, log.read_text() if log.exists() else '')
    assert any(o.startswith('ck/1/') for o in server.objects('ck'))  # the save reached the bucket
  stderr, logged = outputs['checkpointer']
  assert line not in stderr, stderr
  assert line in logged
  assert line in outputs['tensorstore'][0]


def test_tensorstore_auth_probes_only_a_bucket_with_the_test_token(monkeypatch):
  from bipe_jax.state import tensorstore_auth  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(tensorstore_auth, '_started', False)
  monkeypatch.delenv(tensorstore_auth.TOKEN_ENV, raising=False)
  assert not tensorstore_auth.start_quietly('gs://bucket/run')  # real GCS: no such line
  monkeypatch.setenv(tensorstore_auth.TOKEN_ENV, 'emulator')
  assert not tensorstore_auth.start_quietly('/local/run')
  assert not tensorstore_auth.start_quietly('gcs-like/gs://x')
  bucket_of = tensorstore_auth._bucket  # pylint: disable=protected-access
  assert bucket_of('gs://b/run/checkpoints') == 'b' and bucket_of('/local/run') is None
