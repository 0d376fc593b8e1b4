"""eval/che_sweep_shards.sh: N shard processes with the same flags, then one assembling run,
wired as documented (the Python side, --shard and the assembling, is tests/che/test_che.py's)."""

import os
import subprocess

from tests import fixtures

SCRIPT = os.path.join(fixtures.ROOT, 'eval', 'che_sweep_shards.sh')


def _run(tmp_path, *args, **env):
  log = tmp_path / 'calls.txt'
  fake = tmp_path / 'fake_python'  # records each call's arguments instead of running Python
  fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                  '[ -z "$FAIL" ] || case "$*" in *--shard=1/*) exit 3;; esac\n')
  fake.chmod(0o755)
  proc = subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, PYTHON=str(fake), **env))
  calls = log.read_text().splitlines() if log.exists() else []
  return proc, sorted(calls)


def test_shards_then_one_assembling_run(tmp_path):
  out = tmp_path / 'grid'
  proc, calls = _run(tmp_path, '3', '--tasks=parity_check', f'--output_dir={out}')
  assert proc.returncode == 0, proc.stderr
  common = f'eval/che_sweep.py --tasks=parity_check --output_dir={out}'
  assert calls == sorted([f'{common} --shard={i}/3' for i in range(3)] + [common])
  assert sorted(os.listdir(out / 'logs')) == [f'shard_{i}.log' for i in range(3)]


def test_a_failed_shard_is_named_and_assemble_can_be_skipped(tmp_path):
  proc, calls = _run(tmp_path, '2', f'--output_dir={tmp_path}/g', FAIL='1', ASSEMBLE='0')
  assert proc.returncode == 1 and 'shard 1/2 failed' in proc.stderr
  assert len(calls) == 2  # the two shards, no assembling run


def test_bad_process_count_is_one_usage_line(tmp_path):
  for bad in ('0', 'x'):
    proc, calls = _run(tmp_path, bad)
    assert proc.returncode == 2 and proc.stderr.startswith('usage:') and not calls
