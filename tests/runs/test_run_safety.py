"""Runs that cannot be silently wrong: fault injection through the real `train/main.py`.

A changed optimizer setting or another encoding on resume is refused with one line and moves
nothing; a damaged newest checkpoint is set aside alone and the previous one resumes; a finite
number of epochs ends cleanly with a final checkpoint; config.json is written only after the
state exists.
"""

import json
import os

import pytest

from bipe_jax.runs import run_record
from tests.fixtures import SHORT, checkpoint_steps, copy_run, cut_array_files, run_cli

pytestmark = [pytest.mark.slow]

@pytest.fixture(scope='module')
def trained(trained_run):
  """The session's finished 4-step bipe_rope run (checkpoints 2 and 4): copied, never changed."""
  return trained_run


def last_line(proc) -> str:
  lines = proc.stderr.strip().splitlines()
  assert lines, proc.stdout
  return lines[-1]


def tree_listing(workdir):
  return sorted(os.path.relpath(os.path.join(d, f), workdir)
                for d, _, files in os.walk(workdir) for f in files
                if not f.startswith('library') and not f.startswith('events'))


def test_changed_optimizer_setting_is_refused_and_nothing_moves(dirs, trained, tmp_path):
  workdir = copy_run(trained, tmp_path)
  before = tree_listing(workdir)
  config_before = open(os.path.join(workdir, 'config.json'), encoding='utf-8').read()
  proc = run_cli(dirs, workdir, *SHORT, '--config.train.steps=6', '--config.train.grad_clip=0.0',
                 expect=2)
  line = last_line(proc)
  assert line.startswith('config error: checkpoint step 4 in ') and 'optimizer state' in line
  assert 'train.grad_clip' in line and 'Nothing was moved' in line
  assert 'Traceback' not in proc.stderr
  assert not os.path.exists(workdir + '/checkpoints_corrupt')
  assert tree_listing(workdir) == before
  assert open(os.path.join(workdir, 'config.json'), encoding='utf-8').read() == config_before


def test_resume_with_another_encoding_lists_the_fields(dirs, trained, tmp_path):
  workdir = copy_run(trained, tmp_path)
  before = tree_listing(workdir)
  proc = run_cli(dirs, workdir, *SHORT, '--config.model.position_encoding=bipe_alibi',
                 '--config.model.rope_base=500.0', expect=2)
  line = last_line(proc)
  assert line.startswith('config error: ') and 'records another run (2 differing fields' in line
  assert "model.position_encoding: saved 'bipe_rope', now 'bipe_alibi'" in line
  assert 'model.rope_base: saved 10000.0, now 500.0' in line
  assert tree_listing(workdir) == before


def test_resumable_fields_may_change(dirs, trained, tmp_path):
  workdir = copy_run(trained, tmp_path)
  proc = run_cli(dirs, workdir, '--config.train.steps=6', '--config.checkpoint.every_steps=3',
                 '--config.model.attention_impl=dense', '--config.train.log_every=3')
  assert 'resumed from checkpoint step 4' in proc.stdout
  assert checkpoint_steps(workdir) == [2, 4, 6]
  assert 'model.attention_impl' in run_record.RESUMABLE_FIELDS


def test_truncated_newest_checkpoint_falls_back_and_moves_only_it(dirs, trained, tmp_path):
  workdir = copy_run(trained, tmp_path)
  # The array files cut to 10 bytes: a read fails while the other reads of the restore are in
  # flight (they are abandoned: the noise checked below).
  assert cut_array_files(os.path.join(workdir, 'checkpoints', '4', 'state'))
  proc = run_cli(dirs, workdir, *SHORT)
  assert 'checkpoint step 4' in proc.stdout and 'is damaged' in proc.stdout
  assert 'resumed from checkpoint step 2' in proc.stdout
  # The damaged line once on the terminal (not again through the library's log on stderr), no
  # noise from the failed reads (tracebacks of abandoned read coroutines); the log file keeps it.
  terminal = proc.stdout + proc.stderr
  assert terminal.count('is damaged') == 1, terminal[-3000:]
  assert 'Traceback' not in terminal and 'Event loop is closed' not in terminal
  assert len(proc.stderr.splitlines()) <= 1, proc.stderr[:3000]
  with open(os.path.join(workdir, 'library.log'), encoding='utf-8') as f:
    assert f.read().count('checkpoint step 4 in ') == 1
  assert os.listdir(workdir + '/checkpoints_corrupt') == ['4']
  assert checkpoint_steps(workdir) == [2, 4]  # step 4 trained again from step 2


def test_finite_epochs_end_cleanly_with_a_final_checkpoint(dirs, tmp_path):
  workdir = str(tmp_path / 'epochs')
  proc = run_cli(dirs, workdir, '--config.train.steps=100000', '--config.data.num_epochs=1',
                 '--config.checkpoint.every_steps=100000', '--config.checkpoint.async_save=False',
                 '--config.train.log_every=1000')
  assert 'Traceback' not in proc.stderr
  line = [l for l in proc.stdout.splitlines() if 'the training data ended' in l]
  assert line and 'data.num_epochs=1 epoch(s)' in line[0]
  step = int(line[0].split('at step ')[1].split()[0])
  assert 0 < step < 100000 and checkpoint_steps(workdir) == [step]
  assert f'{step * 8 * 32:,} tokens' in line[0]  # batch 8 x seq_len 32


def test_config_json_is_written_only_after_the_state_exists(dirs, trained, tmp_path):
  workdir = copy_run(trained, tmp_path)
  saved = json.load(open(os.path.join(workdir, 'config.json'), encoding='utf-8'))
  assert saved['model']['separator_ids']  # the resolved ids are recorded
  fresh = str(tmp_path / 'fresh')
  proc = run_cli(dirs, fresh, *SHORT, '--config.train.eval_tokens=1', '--config.train.eval_every=1',
                 expect=2)
  assert 'train.eval_tokens=1' in last_line(proc)
  assert not os.path.exists(os.path.join(fresh, 'config.json'))


def test_checkpoints_without_config_json_do_not_resume(dirs, trained, tmp_path):
  """config.json deleted (or lost): what the checkpoints were trained with is unknown, so the
  run refuses to resume, in one line, and changes nothing."""
  workdir = copy_run(trained, tmp_path)
  os.remove(os.path.join(workdir, 'config.json'))
  before = tree_listing(workdir)
  proc = run_cli(dirs, workdir, *SHORT, '--config.train.steps=6', expect=2)
  assert proc.stderr.strip() == last_line(proc), proc.stderr[-3000:]
  assert last_line(proc) == (
      f'config error: {workdir} holds checkpoints (steps [2, 4]) but no config.json, which '
      'records the settings they were trained with: a resume cannot be checked, so it does not '
      'start; restore config.json from a copy, or train in a new workdir')
  assert tree_listing(workdir) == before and checkpoint_steps(workdir) == [2, 4]
