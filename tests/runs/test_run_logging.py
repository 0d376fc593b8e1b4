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
