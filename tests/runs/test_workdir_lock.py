"""One training process per workdir: the lock, its release on any exit, and the trainer's use."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from bipe_jax.training import cli
from bipe_jax.training import trainer
from bipe_jax.runs import workdir_lock
from tests.training.test_training_units import TinyLM, small_config
from tests import fixtures


def test_a_second_holder_is_refused_by_name_until_the_first_lets_go(tmp_path):
  workdir = str(tmp_path / 'run')
  with workdir_lock.hold(workdir):
    text = open(os.path.join(workdir, workdir_lock.LOCK_FILE), encoding='utf-8').read()
    assert text.startswith(f'pid {os.getpid()} on ')
    with pytest.raises(workdir_lock.WorkdirInUseError,
                       match=rf'run is being trained by another process \(pid {os.getpid()} '):
      with workdir_lock.hold(workdir):
        pass
  with workdir_lock.hold(workdir):  # released
    pass
  with workdir_lock.hold(str(tmp_path / 'other'), enabled=False):
    assert not os.path.exists(tmp_path / 'other')  # a process that does not lock touches nothing


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
  workdir = str(tmp_path / 'run')
  holder = subprocess.Popen(
      [sys.executable, '-c', textwrap.dedent(f'''
          import sys, time
          from bipe_jax.runs import workdir_lock
          with workdir_lock.hold({workdir!r}):
            print('held', flush=True)
            time.sleep(120)
      ''')], stdout=subprocess.PIPE, text=True,
      cwd=fixtures.ROOT)
  try:
    assert holder.stdout.readline().strip() == 'held'
    with pytest.raises(workdir_lock.WorkdirInUseError, match=f'pid {holder.pid} '):
      with workdir_lock.hold(workdir):
        pass
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  with workdir_lock.hold(workdir):  # the kernel dropped the dead process's lock
    pass


def test_training_in_a_workdir_in_use_is_refused_and_writes_nothing(tmp_path, capsys):
  workdir = str(tmp_path / 'run')
  with workdir_lock.hold(workdir):
    with pytest.raises(workdir_lock.WorkdirInUseError):
      trainer.train(small_config(), workdir, model=TinyLM(), make_iterator=lambda *a: iter(()))
    assert cli.run(small_config(), workdir) == 2
    assert os.listdir(workdir) == [workdir_lock.LOCK_FILE]
  assert 'is being trained by another process' in capsys.readouterr().err.splitlines()[-1]
