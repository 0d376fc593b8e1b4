"""A user's mistake on any command line is one line on stderr and a non-zero exit, no traceback.

Each case runs the real script in a subprocess; all of them fail before anything is compiled.
"""

import os
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from bipe_jax import cli
from bipe_jax.evaluation import cli as eval_cli
from bipe_jax.runs import run_record
from configs import base
from configs import passkey_tiny
from tests import fixtures
from tests import forkserver

ROOT = fixtures.ROOT


def run(script, *args, cwd=ROOT):
  """`python ROOT/script *args` (`python -m *args` for script '-m') in `cwd`, on CPU, with the
  suite's environment (its compilation cache, conftest.py); the CompletedProcess."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  target = script if script == '-m' else os.path.join(ROOT, script)
  return forkserver.run([sys.executable, target, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300, check=False)


def one_line(proc, code=2) -> str:
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == code and len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
  return lines[0]


def parse(tmp_path, *args):
  """bipe_jax.cli.parse_flags on a fresh flag set like train/main.py's: (exit code, stderr)."""
  flag_values = flags.FlagValues()
  argv = ['prog', '--config=configs/tiny.py', *args]
  config_flags.DEFINE_config_file('config', None, '', flag_values=flag_values, sys_argv=argv,
                                  lock_config=True)
  flags.DEFINE_string('workdir', str(tmp_path / 'run'), '', flag_values=flag_values)
  with pytest.raises(SystemExit) as exit_info:
    cli.parse_flags(argv, flag_values)
  return exit_info.value.code


@pytest.mark.parametrize('args, expected', [
    (('--config.model.position_encodng=rope',),
     'error: --config.model.position_encodng=rope: the config has no field '
     'model.position_encodng; did you mean --config.model.position_encoding?'),
    (('--config=configs/tinyy.py',),
     'error: --config=configs/tinyy.py: no such config file; did you mean configs/tiny.py?'),
    (('--config.train.steps=abc',), 'error: flag --config.train.steps=abc: invalid literal'),
    (('--workdi=x',), "error: Unknown command line flag 'workdi'. Did you mean: workdir ?"),
    (('stray',), "error: unexpected arguments ['stray']"),
    (('--config=configs/paper_151m.py:bipe_ropee',),  # get_config's own message, no traceback
     'error: --config=configs/paper_151m.py:bipe_ropee: configs/paper_151m.py:bipe_ropee is not '
     'a preset: choose one of rope, bipe_rope'),
])
def test_flag_errors_are_one_line(tmp_path, capsys, args, expected):
  assert parse(tmp_path, *args) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and err.startswith(expected), err


def test_a_directory_flag_naming_a_file_is_one_line(tmp_path, capsys):
  path = tmp_path / 'file'
  path.write_text('')
  assert parse(tmp_path, f'--workdir={path}') == 2
  assert capsys.readouterr().err == f'error: --workdir={path} is a file, not a directory\n'


@pytest.mark.parametrize('args, expected', [
    (('--config.train.step=5',),
     'error: --config.train.step=5: the config has no field train.step; did you mean '
     '--config.train.steps?'),
    (('--config.model.position_encoding=bipe_ropee',),
     "config error: model.position_encoding='bipe_ropee' is invalid: did you mean 'bipe_rope'? "
     'must be one of nope, sinusoidal,'),
    (('--config.data.seq_len=-5',), 'config error: data.seq_len=-5 is invalid'),
])
def test_training_cli_user_errors_are_one_line(tmp_path, args, expected):
  workdir = tmp_path / 'run'
  proc = run('train/main.py', '--config=configs/tiny.py', f'--workdir={workdir}', *args)
  assert one_line(proc).startswith(expected)
  assert not workdir.exists()  # nothing written, not even a log file


def _saved_run(path, config):
  run_record.write_config(str(path), config)
  return str(path)


def test_evaluation_refuses_a_dataset_that_does_not_fit_the_run(tmp_path, capsys):
  passkey_run = _saved_run(tmp_path / 'pk', passkey_tiny.get_config('bipe_rope'))
  text_run = _saved_run(tmp_path / 'text', base.get_base_config())
  line = one_line(run('eval/perplexity.py', f'--workdir={passkey_run}', '--dataset=embedded',
                      '--lengths=64', '--output='))
  assert line.startswith("error: --dataset=embedded: workdir") and "the 'passkey' task" in line
  assert eval_cli.perplexity_main(workdirs=[text_run], lengths='64', dataset='passkey',
                                  output='') == 2
  line = capsys.readouterr().err.strip()
  assert "the 'passkey' task's samples fit only a run trained on it" in line
  assert "data.dataset='embedded'" in line


def test_unknown_field_message_names_the_whole_path():
  error = AttributeError(KeyError('\'steps\'\nDid you mean "step" instead of "steps"?'))
  argv = ['prog', '--config.train.x=1', '--config.train.steps=5']
  assert cli.unknown_field_message(error, argv, ['config']) == (
      '--config.train.steps=5: the config has no field train.steps; did you mean '
      '--config.train.step?')
  assert cli.unknown_field_message(AttributeError('other'), argv, ['config']) is None


@pytest.fixture
def absl_verbosity_kept():
  """cli.run quiets absl logging: put the test process's verbosity back afterwards."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  before = absl_logging.get_verbosity()
  yield
  absl_logging.set_verbosity(before)


def test_ctrl_c_outside_the_training_loop_is_one_line(monkeypatch, capsys, absl_verbosity_kept):
  def main(argv):
    del argv
    raise KeyboardInterrupt

  monkeypatch.setattr(sys, 'argv', ['prog'])
  with pytest.raises(SystemExit) as exit_info:
    cli.run(main)
  assert exit_info.value.code == 130
  assert capsys.readouterr().err == 'error: interrupted\n'


def test_a_real_bug_keeps_its_traceback(monkeypatch, absl_verbosity_kept):
  def main(argv):
    del argv
    raise ZeroDivisionError('a bug')

  monkeypatch.setattr(sys, 'argv', ['prog'])
  with pytest.raises(ZeroDivisionError, match='a bug'):
    cli.run(main)


def test_help_exits_0(capsys):
  from absl import app  # pylint: disable=g-import-not-at-top
  flag_values = flags.FlagValues()
  flags.DEFINE_flag(app.HelpFlag(), flag_values=flag_values)
  flags.DEFINE_string('workdir', '', 'the run', flag_values=flag_values)
  with pytest.raises(SystemExit) as exit_info:
    cli.parse_flags(['prog', '--help'], flag_values)
  assert exit_info.value.code == 0  # absl itself exits 1 after printing the usage
  assert capsys.readouterr().out


def test_a_truncated_config_json_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
  from bipe_jax.runs import restore as run_restore  # pylint: disable=g-import-not-at-top
  from bipe_jax import storage  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import cli as train_cli  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import trainer  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'config.json').write_text('{"model": {"position_encoding": "ro')
  expected = f'{workdir / "config.json"} is not valid JSON (Unterminated string'
  with pytest.raises(storage.DamagedFileError, match=expected.replace('(', r'\(')):
    run_restore.read_config(str(workdir))  # what evaluation reads (its CLI prints ValueErrors)
  config = base.get_base_config()
  # training: the resume check reads it; the CLI prints one line and exits 2
  monkeypatch.setattr(trainer, 'train',
                      lambda config, workdir: run_record.check_resume(workdir, config))
  monkeypatch.setattr(train_cli.distributed, 'initialize', lambda *args: None)
  assert train_cli.run(config, str(workdir)) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and err.startswith(f'error: {expected}'), err
  # what it suggests is safe: never to delete the file (without it a resume is unchecked)
  assert err.rstrip().endswith('the file is damaged or truncated; restore it from a copy (it '
                               'records the settings the checkpoints were trained with), or '
                               'train in a new workdir'), err
  assert 'remove' not in err
  with pytest.raises(storage.DamagedFileError, match='restore it from a copy .*new workdir'):
    run_restore.read_config(str(workdir))


def test_sigusr1_prints_every_threads_stack_and_the_run_goes_on():
  """`kill -USR1 PID` on a CLI (bipe_jax.cli.run): every thread's stack on stderr, no exit."""
  code = ('import os, signal, sys, time\n'
          'from bipe_jax import cli\n'
          'def main(argv):\n'
          '  os.kill(os.getpid(), signal.SIGUSR1)\n'
          '  time.sleep(0.5)\n'
          '  print("still running")\n'
          'cli.run(main)\n')
  proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True,
                        text=True, timeout=120, check=False)
  assert proc.returncode == 0 and proc.stdout.strip() == 'still running', proc.stderr[-2000:]
  assert 'Current thread' in proc.stderr and 'in main' in proc.stderr, proc.stderr[-2000:]
