"""End-to-end tests of `train/main.py` in subprocesses (JAX device flags set before import).

One single-device baseline run (made once per session) (N steps, constant learning rate so runs with
other `train.steps` share the same per-step updates) is the reference for:
- 8 fake CPU devices, mesh data=2 fsdp=2 tensor=2;
- two processes on 127.0.0.1 (jax.distributed, gloo), each with 2 fake devices;
- a run stopped by Ctrl-C (SIGINT), then by SIGTERM, and one killed by SIGKILL after a
  checkpoint, each restarted (metrics.jsonl then holds each step once);
- checkpoints restored across meshes (1 -> 8 devices, then 8 -> 1).
The data is a small generated text folder (dataset=text_folder) with a 320-piece tokenizer,
prepared once by the baseline run; `train.data_shards=2` makes the global batches identical
for one or two processes. The data, the CLI helpers and the shared directory are
tests/fixtures.py's.
"""

import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import portpicker
import pytest

# The shared helpers, importable from here as before (other test files import them by these names).
from tests.fixtures import CLI_EVERY, CLI_STEPS, MAIN, ROOT, checkpoint_steps, cli_args, cli_env, dirs, file_lock, run_cli, write_text_folder  # pylint: disable=unused-import

pytestmark = [pytest.mark.slow]

N = CLI_STEPS  # baseline steps
EVERY = CLI_EVERY  # checkpoint interval


def read_losses(workdir) -> dict:
  """{step: loss} from metrics.jsonl; a step logged twice (re-run after a kill) must agree."""
  losses = {}
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    for line in f:
      row = json.loads(line)
      if row['step'] in losses:
        np.testing.assert_allclose(row['loss'], losses[row['step']], rtol=1e-6)
      losses[row['step']] = row['loss']
  return losses


def assert_losses_match(got, want, steps, rtol=1e-6):
  missing = [s for s in steps if s not in got]
  assert not missing, f'steps {missing} were not logged'
  np.testing.assert_allclose([got[s] for s in steps], [want[s] for s in steps], rtol=rtol)


@pytest.fixture(scope='module')
def baseline(dirs):
  """The uninterrupted single-device run (made once per session, under a lock)."""
  workdir = str(dirs / 'baseline')
  with file_lock(str(dirs / '.baseline.lock')):
    if not os.path.exists(os.path.join(workdir, 'DONE')):
      shutil.rmtree(workdir, ignore_errors=True)
      proc = run_cli(dirs, workdir)
      assert "mesh {'data': 1" in proc.stdout and f'step {N}/{N}' in proc.stdout
      open(os.path.join(workdir, 'DONE'), 'w', encoding='utf-8').close()
  losses = read_losses(workdir)
  assert sorted(losses) == list(range(1, N + 1))
  assert losses[N] < losses[1] - 1.0  # it learns
  return workdir, losses


def copy_checkpoint(src_workdir, step, dst_workdir):
  """A new workdir holding only checkpoint `step` of `src_workdir` and the config.json it was
  trained with (a workdir with checkpoints but no config.json refuses to resume)."""
  os.makedirs(os.path.join(dst_workdir, 'checkpoints'))
  shutil.copy(os.path.join(src_workdir, 'config.json'), dst_workdir)
  shutil.copytree(os.path.join(src_workdir, 'checkpoints', str(step)),
                  os.path.join(dst_workdir, 'checkpoints', str(step)))


def test_eight_devices_reproduce_single_device_losses(dirs, baseline):
  _, want = baseline
  workdir = str(dirs / 'mesh8')
  proc = run_cli(dirs, workdir, '--config.train.steps=6', '--config.mesh.data=2',
                 '--config.mesh.fsdp=2', '--config.mesh.tensor=2', devices=8)
  assert "mesh {'data': 2, 'fsdp': 2, 'context': 1, 'tensor': 2} on 8 devices" in proc.stdout
  assert_losses_match(read_losses(workdir), want, range(1, 7), rtol=2e-5)


def test_two_processes_reproduce_single_process_losses(dirs, baseline):
  _, want = baseline
  workdir = str(dirs / 'two_processes')
  port = portpicker.pick_unused_port()
  procs = []
  start = time.perf_counter()
  for pid in range(2):
    args = cli_args(dirs, workdir, '--config.train.steps=6',
                    f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
                    f'--process_id={pid}')
    procs.append(subprocess.Popen(args, cwd=ROOT, env=cli_env(dirs, devices=2),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=300)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  wall = time.perf_counter() - start
  print(f'two-process CLI run wall time: {wall:.1f}s')
  assert [p.returncode for p in procs] == [0, 0], '\n'.join(o[-3000:] for o in outputs)
  assert 'on 4 devices, 2 processes' in outputs[0]
  assert 'step 6/' in outputs[0] and 'step 6/' not in outputs[1]  # process 0 logs
  assert_losses_match(read_losses(workdir), want, range(1, 7), rtol=2e-5)
  assert checkpoint_steps(workdir) == [6]
  names = sorted(os.listdir(os.path.join(workdir, 'checkpoints', '6', 'data')))
  assert [n for n in names if n.startswith('process_')] == ['process_0-of-2.json',
                                                           'process_1-of-2.json']


def _start_and_signal(dirs, workdir, ready, sig, *extra):
  """Starts the CLI, waits until `ready()` and sends `sig`; returns (returncode, output)."""
  proc = subprocess.Popen(cli_args(dirs, workdir, *extra), cwd=ROOT, env=cli_env(dirs),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 300
  try:
    while not ready() and proc.poll() is None and time.time() < deadline:
      time.sleep(0.005)
    proc.send_signal(sig)
    out = proc.communicate(timeout=300)[0]
  finally:
    if proc.poll() is None:
      proc.kill()
  return proc.returncode, out


def _logged_step(workdir):
  try:
    with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
      lines = f.read().splitlines()
    return json.loads(lines[-1])['step'] if lines else 0
  except (OSError, ValueError):
    return 0


def logged_steps(workdir) -> list:
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [json.loads(line)['step'] for line in f if 'loss' in json.loads(line)]


def test_ctrl_c_then_sigterm_save_and_the_same_command_resumes(dirs, baseline):
  """Ctrl-C (SIGINT): checkpoint, one line, exit 130; SIGTERM: checkpoint, exit 75 (preempted,
  bipe_jax.cli.EXIT_PREEMPTED; a finished run exits 0); each time
  the same command resumes, and metrics.jsonl ends with every step once."""
  _, want = baseline
  workdir = str(dirs / 'signals')
  rc, out = _start_and_signal(dirs, workdir, lambda: _logged_step(workdir) >= 3, signal.SIGINT)
  assert rc == 130, out[-3000:]
  assert 'Traceback' not in out and 'KeyboardInterrupt' not in out, out[-3000:]
  assert 'preempted (SIGINT) at step' in out.strip().splitlines()[-1], out[-3000:]
  first = checkpoint_steps(workdir)[-1]
  assert 3 <= first < N and first == _logged_step(workdir)
  rc, out = _start_and_signal(dirs, workdir, lambda: _logged_step(workdir) >= first + 3,
                              signal.SIGTERM)
  assert rc == 75, out[-3000:]
  assert f'resumed from checkpoint step {first}' in out
  assert 'preempted (SIGTERM) at step' in out, out[-3000:]
  second = checkpoint_steps(workdir)[-1]
  assert first + 3 <= second < N and second == _logged_step(workdir)
  proc = run_cli(dirs, workdir)
  assert f'resumed from checkpoint step {second}' in proc.stdout
  assert logged_steps(workdir) == list(range(1, N + 1))
  assert_losses_match(read_losses(workdir), want, range(1, N + 1))


def test_sigkill_after_checkpoint_resumes_from_it(dirs, baseline):
  _, want = baseline
  workdir = str(dirs / 'sigkill')
  ckpt = os.path.join(workdir, 'checkpoints', str(EVERY))
  rc, _ = _start_and_signal(dirs, workdir, lambda: os.path.isdir(ckpt), signal.SIGKILL)
  assert rc == -signal.SIGKILL
  killed_at = _logged_step(workdir)
  assert killed_at < N, 'the run finished before it was killed'
  proc = run_cli(dirs, workdir)
  resumed = int(proc.stdout.split('resumed from checkpoint step ')[1].split()[0])
  assert EVERY <= resumed <= killed_at
  assert logged_steps(workdir) == list(range(1, N + 1))  # the steps re-run are logged once
  assert_losses_match(read_losses(workdir), want, range(1, N + 1))


def test_checkpoints_restore_across_mesh_shapes(dirs, baseline):
  src, want = baseline
  first = checkpoint_steps(src)[0]
  to8 = str(dirs / 'one_to_eight')
  copy_checkpoint(src, first, to8)
  proc = run_cli(dirs, to8, f'--config.train.steps={first + 4}', '--config.mesh.data=2',
                 '--config.mesh.fsdp=2', '--config.mesh.tensor=2', devices=8)
  assert f'resumed from checkpoint step {first}' in proc.stdout
  assert_losses_match(read_losses(to8), want, range(first + 1, first + 5), rtol=2e-5)
  to1 = str(dirs / 'eight_to_one')
  copy_checkpoint(to8, first + 4, to1)
  proc = run_cli(dirs, to1, f'--config.train.steps={first + 8}')
  assert f'resumed from checkpoint step {first + 4}' in proc.stdout
  assert_losses_match(read_losses(to1), want, range(first + 5, first + 9), rtol=2e-5)


def test_bad_config_value_stops_with_one_line(dirs):
  proc = run_cli(dirs, str(dirs / 'bad'), '--config.train.learning_rate=-0.1', expect=2)
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('config error: train.learning_rate=-0.1 is invalid'), proc.stderr
