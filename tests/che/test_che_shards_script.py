"""eval/che_sweep_shards.sh: N processes with the same flags and one queue, then one assembling
run, wired as documented (the Python side, --queue_dir and the assembling, is
tests/che/test_che.py's)."""

import os
import re
import subprocess

from tests import fixtures

SCRIPT = os.path.join(fixtures.ROOT, 'eval', 'che_sweep_shards.sh')


def _run(tmp_path, *args, **env):
  log = tmp_path / 'calls.txt'
  fake = tmp_path / 'fake_python'  # records each call's arguments instead of running Python
  fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'  # with FAIL set, the first call fails
                  f'[ -z "$FAIL" ] || ! mkdir {tmp_path}/failed 2>/dev/null || exit 3\n')
  fake.chmod(0o755)
  proc = subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, PYTHON=str(fake), TMPDIR=str(tmp_path), **env))
  calls = log.read_text().splitlines() if log.exists() else []
  return proc, sorted(calls)


def test_workers_share_one_queue_then_one_assembling_run(tmp_path):
  out = tmp_path / 'grid'
  proc, calls = _run(tmp_path, '3', '--tasks=parity_check', f'--output_dir={out}')
  assert proc.returncode == 0, proc.stderr
  common = f'eval/che_sweep.py --tasks=parity_check --output_dir={out}'
  assert calls[0] == common and len(calls) == 4
  queues = {re.fullmatch(re.escape(common) + r' --queue_dir=(\S+)', c).group(1)
            for c in calls[1:]}
  assert len(queues) == 1  # one queue for all three workers, in TMPDIR, removed at the end
  (queue,) = queues
  assert os.path.dirname(queue) == str(tmp_path) and not os.path.exists(queue)
  assert sorted(os.listdir(out / 'logs')) == [f'worker_{i}.log' for i in range(3)]


def test_a_failed_worker_is_named_and_assemble_can_be_skipped(tmp_path):
  proc, calls = _run(tmp_path, '2', f'--output_dir={tmp_path}/g', FAIL='1', ASSEMBLE='0')
  assert proc.returncode == 1
  assert re.search(r'process [01]/2 failed: \S+/g/logs/worker_[01]\.log', proc.stderr)
  assert len(calls) == 2  # the two workers, no assembling run


def test_bad_process_count_is_one_usage_line(tmp_path):
  for bad in ('0', 'x'):
    proc, calls = _run(tmp_path, bad)
    assert proc.returncode == 2 and proc.stderr.startswith('usage:') and not calls
