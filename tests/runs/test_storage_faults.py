"""Storage faults, each against a real fake-gcs-server on 127.0.0.1 (tests/gcs_server.py) or a
local folder that takes no write: one line and a distinct exit code, never a traceback or a hang.

- the server dies mid-training (checkpoints every 2 steps): the run stops within 4 steps of the
  kill with exit 74 (bipe_jax.cli.EXIT_STORAGE) and at most 10 lines besides its progress; an
  evaluation of that workdir, the server still down, exits 74 within 60 s in at most 5 lines;
  with the server restarted on the same folder, the same command resumes from the last
  checkpoint saved, repeats its losses, and SIGTERM then stops it with exit 75 (preempted);
- a SIGTERM while a save hangs (the server frozen, SIGSTOP) still ends the run, within
  BIPE_JAX_STOP_GRACE_S, in one line;
- the storage down at the start of training: one line naming the bucket and the endpoint within
  30 s, exit 74;
- no such bucket, a workdir or output that takes no write, a bad bound in the environment: one
  line, exit 2, before any work;
- the retry bounds (bipe_jax.storage_faults): the defaults fit the limits above, a bucket that
  does not answer fails within them naming the bucket and the endpoint, Orbax's tensorstore
  contexts get them; library.log on a bucket that stops answering costs one warning line.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from bipe_jax import storage_faults
from tests import fixtures
from tests import forkserver
# pylint: disable-next=unused-import
from tests.gcs_server import gcs_server, gcs_server_module  # noqa: F401
from tests.runs.test_workdir_remote import bucket  # noqa: F401  pylint: disable=unused-import

pytestmark = [pytest.mark.slow]

ROOT = fixtures.ROOT
STEPS, EVERY = 400, 2  # the runs are stopped (a kill, SIGTERM) long before train.steps
FAST_RETRIES = {storage_faults.WAIT_ENV: '0.2'}  # 4 tries over 1.4 s: the tests stay short
PROGRESS = ('step ', 'resumed from', 'mesh {', 'MFU is measured', 'model.rope_original')


def _train_args(dirs, workdir, *extra):
  return fixtures.cli_args(dirs, workdir, f'--config.train.steps={STEPS}',
                           f'--config.checkpoint.every_steps={EVERY}', *extra)


class _Run:
  """A command started in the background, its output (stdout and stderr merged) read by a
  thread as it comes: `lines` is what it printed so far."""

  def __init__(self, args, env):
    self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, bufsize=1)
    self.lines = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stdout:
      self.lines.append(line.rstrip('\n'))

  def last_step(self) -> int:
    return max([s for s in map(_step, list(self.lines)) if s is not None] or [0])

  def wait_for_step(self, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while self.last_step() < step:
      if self.proc.poll() is not None or time.monotonic() > deadline:
        self.proc.kill()
        pytest.fail(f'no step {step}:\n' + '\n'.join(self.lines[-30:]))
      time.sleep(0.05)

  def finish(self, timeout: float) -> int:
    try:
      self.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.proc.send_signal(signal.SIGUSR1)  # every thread's stack (bipe_jax.cli), then kill
      time.sleep(3)
      self.proc.kill()
      self.proc.wait()
      self._reader.join(10)
      pytest.fail(f'still running {timeout} s later:\n' + '\n'.join(self.lines[-400:]))
    self._reader.join(10)
    return self.proc.returncode


def _step(line: str):
  """The step of a progress line 'step 12/40 | loss ...', else None."""
  if line.startswith('step ') and '/' in line.split()[1]:
    return int(line.split()[1].split('/')[0])
  return None


def _losses(server, workdir_key: str) -> dict:
  """{step: loss} of the run's metrics.jsonl in the bucket (its parts in order; a step logged
  twice keeps its last line)."""
  server.fs.invalidate_cache()
  base = f'{server.bucket}/{workdir_key}/metrics.jsonl'
  parts = sorted(p for p in server.fs.ls(f'{server.bucket}/{workdir_key}')
                 if p == base or p.startswith(base + '.'))
  losses = {}
  for part in parts:
    for line in server.fs.cat(part).decode().splitlines():
      record = json.loads(line)
      if 'loss' in record:
        losses[record['step']] = record['loss']
  return losses


def test_the_server_dies_mid_training_then_comes_back(dirs, gcs_server):  # noqa: F811
  server = gcs_server
  workdir = f'gs://{server.bucket}/run'
  env = server.env(fixtures.cpu_env(), **FAST_RETRIES)
  run = _Run(_train_args(dirs, workdir), env)
  run.wait_for_step(5)
  deadline = time.monotonic() + 60  # a checkpoint is complete (Orbax's marker on a bucket)
  while ('run/checkpoints/2/commit_success.txt' not in server.objects('run/checkpoints')
         and time.monotonic() < deadline):
    time.sleep(0.1)
  server.kill()
  killed_at, step_at_kill = time.monotonic(), run.last_step()
  rc = run.finish(timeout=300)
  ended_after = time.monotonic() - killed_at
  lines = run.lines
  text = '\n'.join(lines)
  assert rc == 74, text[-3000:]
  assert ended_after < 300, ended_after
  assert 'Traceback' not in text, text[-3000:]
  last_step = run.last_step()
  assert last_step <= step_at_kill + 4, (step_at_kill, text[-3000:])
  others = [l for l in lines if not l.startswith(PROGRESS)]
  assert len(others) <= 10, others
  errors = [l for l in lines if l.startswith('error: ')]
  assert len(errors) == 1, others
  assert server.url in errors[0] and server.bucket in errors[0], errors[0]
  kept = re.search(r'the last checkpoint saved is step (\d+)', errors[0])
  assert kept, errors[0]
  kept = int(kept.group(1))
  # a save cut short by the kill may have written Orbax's marker first: the line names it too
  unsure = re.search(r'\(or step (\d+), if its save, cut short, completed', errors[0])
  unsure = int(unsure.group(1)) if unsure else None
  assert unsure is None or unsure > kept, errors[0]

  # the server still down: evaluating the run fails fast, in a few lines, naming bucket and URL
  start = time.monotonic()
  evaluation = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'eval', 'perplexity.py'), f'--workdir={workdir}',
       '--lengths=32'], cwd=ROOT, env=server.env(fixtures.cpu_env()), capture_output=True,
      text=True, timeout=120)
  took = time.monotonic() - start
  out = evaluation.stdout + evaluation.stderr
  assert evaluation.returncode == 74 and took < 60, (took, out[-2000:])
  assert len(out.strip().splitlines()) <= 5 and 'Traceback' not in out, out[-2000:]
  assert f'gs://{server.bucket}' in out and server.url in out, out

  # restarted on the same folder: the same command resumes from the last checkpoint saved
  server.restart()  # Orbax marks a finished checkpoint on a bucket with commit_success.txt
  # (a step's own marker: its items, state/ and data/, have theirs, written before it)
  complete = sorted(int(name.split('/')[2]) for name in server.objects('run/checkpoints')
                    if re.fullmatch(r'run/checkpoints/\d+/commit_success\.txt', name))
  assert complete and complete[-1] in (kept, unsure) and kept in complete, (complete, kept, unsure)
  assert EVERY <= kept <= last_step, (kept, last_step)
  kept = complete[-1]  # the newest complete checkpoint: where the same command resumes
  before = _losses(server, 'run')
  run = _Run(_train_args(dirs, workdir), env)
  run.wait_for_step(kept + 3)
  run.proc.send_signal(signal.SIGTERM)
  rc = run.finish(timeout=120)
  text = '\n'.join(run.lines)
  assert f'resumed from checkpoint step {kept} in {workdir}/checkpoints' in text, text
  assert rc == 75 and 'preempted (SIGTERM) at step' in text, text[-3000:]
  after = _losses(server, 'run')
  repeated = [s for s in before if kept < s <= max(after)]
  assert repeated, (before, after)
  for s in repeated:  # the steps trained again from the checkpoint: the same batches, losses
    assert after[s] == pytest.approx(before[s], rel=1e-5), (s, before[s], after[s])


def test_sigterm_ends_the_run_while_a_save_hangs(dirs, gcs_server):  # noqa: F811
  """The server frozen (SIGSTOP: connections open, nothing answers): the run's writes hang;
  SIGTERM still ends it within the grace, with one line and exit 74."""
  server = gcs_server
  env = server.env(fixtures.cpu_env(), BIPE_JAX_STOP_GRACE_S='5', **FAST_RETRIES)
  run = _Run(_train_args(dirs, f'gs://{server.bucket}/frozen'), env)
  run.wait_for_step(3)
  pid = server._proc.pid  # pylint: disable=protected-access
  os.kill(pid, signal.SIGSTOP)
  try:
    time.sleep(1.0)  # the run's next writes now wait on the frozen server
    run.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    rc = run.finish(timeout=60)
    took = time.monotonic() - sent
  finally:
    os.kill(pid, signal.SIGCONT)
  lines = run.lines
  text = '\n'.join(lines)
  assert rc == 74 and took < 30, (took, text[-3000:])
  assert 'Traceback' not in text, text[-3000:]
  errors = [l for l in lines if l.startswith('error: ')]
  assert len(errors) == 1 and 'after SIGTERM' in errors[0], text[-3000:]


def _run(args, env, timeout=120):
  """(exit code, output lines, seconds) of a command (through the suite's fork server: a
  local path's commands need no emulator variables at import)."""
  start = time.monotonic()
  proc = forkserver.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout)
  return proc.returncode, (proc.stdout + proc.stderr).strip().splitlines(), time.monotonic() - start


def test_paths_that_take_no_write_are_one_line_before_any_work(dirs, trained_run, tmp_path,
                                                               gcs_server_module):  # noqa: F811
  """/sys takes no write, even for root; a path under a file is no folder; the bucket does not
  exist. Each: exit 2, one line naming the path, nothing trained or evaluated."""
  a_file = tmp_path / 'file.txt'
  a_file.write_text('x')
  for workdir, says in (('/sys/bipe_faults/run', '/sys/bipe_faults/run is not a writable folder'),
                        (str(a_file / 'run'), f'{a_file} is a file')):
    rc, out, _ = _run(fixtures.cli_args(dirs, workdir), fixtures.cpu_env())
    assert rc == 2 and len(out) == 1 and says in out[0], out
  for name, value in (('BIPE_JAX_STOP_GRACE_S', '0'), ('BIPE_JAX_CHECKPOINT_TIMEOUT_S', '1.5'),
                      (storage_faults.ATTEMPTS_ENV, 'many')):
    rc, out, _ = _run(fixtures.cli_args(dirs, str(tmp_path / 'run')),
                      fixtures.cpu_env(**{name: value}))
    assert rc == 2 and len(out) == 1 and out[0].startswith(f'error: {name}='), out
  proc = subprocess.run(  # a plain process: the emulator's variables are read at import
      fixtures.cli_args(dirs, 'gs://no-such-bucket-here/run'), cwd=ROOT, capture_output=True,
      text=True, timeout=120, env=gcs_server_module.env(fixtures.cpu_env(), **FAST_RETRIES))
  out = (proc.stdout + proc.stderr).strip().splitlines()
  assert proc.returncode == 2 and len(out) == 1, out
  assert "no bucket 'no-such-bucket-here' at " + gcs_server_module.url in out[0], out
  evaluate = [sys.executable, os.path.join(ROOT, 'eval', 'perplexity.py'),
              f'--workdir={trained_run}', '--lengths=32']
  for flag, says in (('--output=/sys/bipe_faults.json', 'cannot write /sys/bipe_faults.json'),
                     ('--plot=/sys/bipe_faults.png', 'cannot write /sys/bipe_faults.png'),
                     (f'--output={tmp_path}', f'{tmp_path} is a folder')):
    rc, out, _ = _run(evaluate + [flag], fixtures.cpu_env())
    assert rc == 2 and len(out) == 1 and says in out[0], out
  assert not os.path.exists(os.path.join(trained_run, 'perplexity.json'))
  rc, out, _ = _run([sys.executable, os.path.join(ROOT, 'eval', 'visualize.py'),
                     f'--workdir={trained_run}', '--output_dir=/sys/bipe_faults'],
                    fixtures.cpu_env())
  assert rc == 2 and out == ['error: --output_dir: /sys/bipe_faults is not a writable folder: '
                             'Permission denied (in /sys)'], out


def test_retry_bounds_from_the_environment():
  default = storage_faults.RetryPolicy.from_env({})
  # a bucket that does not answer fails a request within 30 s (the start-up check's limit)
  assert default.budget_s() + default.attempts * 0.5 <= 30 and default.attempts >= 2
  assert storage_faults.tensorstore_retries(default) == {
      'max_retries': 4, 'initial_delay': '1s', 'max_delay': '4s'}
  policy = storage_faults.RetryPolicy.from_env({storage_faults.ATTEMPTS_ENV: '3',
                                                storage_faults.WAIT_ENV: '0.5'})
  assert [policy.wait(a) for a in range(policy.attempts - 1)] == [0.5, 1.0]
  for name, value in ((storage_faults.ATTEMPTS_ENV, '0'), (storage_faults.WAIT_ENV, 'x'),
                      (storage_faults.TIMEOUT_ENV, '-1')):
    with pytest.raises(ValueError, match=f'^{name}='):
      storage_faults.RetryPolicy.from_env({name: value})


def test_orbax_tensorstore_contexts_get_the_bound(monkeypatch):
  """Every tensorstore context Orbax makes for a checkpoint (with and without OCDBT) retries a
  GCS request as the environment says, not tensorstore's 32 times."""
  # pylint: disable-next=g-import-not-at-top
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils
  from bipe_jax.state import checkpointing  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(storage_faults.ATTEMPTS_ENV, '3')
  monkeypatch.setenv(storage_faults.WAIT_ENV, '0.5')
  checkpointing.bound_tensorstore_retries()
  for use_ocdbt in (True, False):
    resource = ts_utils.get_ts_context(use_ocdbt=use_ocdbt)['gcs_request_retries'].to_json()
    assert resource == {'max_retries': 3, 'initial_delay': '500ms', 'max_delay': '1s'}
  monkeypatch.delenv(storage_faults.ATTEMPTS_ENV)
  monkeypatch.delenv(storage_faults.WAIT_ENV)
  checkpointing.bound_tensorstore_retries()  # the defaults back for the tests that follow


def test_a_bucket_that_does_not_answer_fails_within_the_bound(monkeypatch):
  """In process: nothing listens on the port; every bipe_jax.storage call and the start-up
  check fail after the policy's tries (not gcsfs's six), naming the bucket and the endpoint,
  and `isdir` does not read the silence as "no such folder"."""
  import portpicker  # pylint: disable=g-import-not-at-top
  from bipe_jax import storage  # pylint: disable=g-import-not-at-top
  url = f'http://127.0.0.1:{portpicker.pick_unused_port()}'
  monkeypatch.setenv('STORAGE_EMULATOR_HOST', url)
  monkeypatch.setenv(storage_faults.WAIT_ENV, '0.1')
  monkeypatch.setattr(storage_faults, '_REACHED', set())
  import fsspec  # pylint: disable=g-import-not-at-top
  fsspec.filesystem('gs').clear_instance_cache()
  for call in (lambda: storage_faults.check_reachable('gs://quiet-bucket/run'),
               lambda: storage.isdir('gs://quiet-bucket/run'),
               lambda: storage.exists('gs://quiet-bucket/run/config.json'),
               lambda: storage.read_json('gs://quiet-bucket/run/config.json')):
    start = time.monotonic()
    with pytest.raises(storage_faults.StorageUnreachableError) as error:
      call()
    assert time.monotonic() - start < 0.1 + 0.2 + 0.4 + 3.0
    assert str(error.value).startswith(f'storage unreachable: gs://quiet-bucket at {url} '
                                       'did not answer in 4 tries'), error.value


def test_training_with_the_storage_down_at_start_is_one_line(dirs):
  """Nothing answers at STORAGE_EMULATOR_HOST: the default bounds give up within 30 s, in one
  line naming the bucket and the endpoint, exit 74, before any work."""
  import portpicker  # pylint: disable=g-import-not-at-top
  url = f'http://127.0.0.1:{portpicker.pick_unused_port()}'
  env = {k: v for k, v in fixtures.cpu_env().items() if not k.startswith('BIPE_JAX_STORAGE')}
  env.update(STORAGE_EMULATOR_HOST=url)
  for name in ('CLOUD_STORAGE_EMULATOR_ENDPOINT', 'TENSORSTORE_GCS_HTTP_URL',
               'GOOGLE_AUTH_TOKEN_FOR_TESTING'):
    env.pop(name, None)
  start = time.monotonic()
  proc = subprocess.run(fixtures.cli_args(dirs, 'gs://bipe-down/run'), cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  took = time.monotonic() - start
  out = (proc.stdout + proc.stderr).strip().splitlines()
  assert proc.returncode == 74 and took < 30, (took, out)
  assert len(out) == 1, out
  assert out[0].startswith(f'error: storage unreachable: gs://bipe-down at {url}'), out


def test_a_bucket_log_that_stops_answering_costs_one_warning(
    bucket, monkeypatch, capsys):  # noqa: F811  pylint: disable=redefined-outer-name
  """library.log on a bucket: the first failed write stops the writing (each later line would
  wait out the retries again, under the lock every thread logs through); close tries once more
  and says in one line that the last lines were lost. No logging traceback."""
  import logging  # pylint: disable=g-import-not-at-top
  from bipe_jax import storage  # pylint: disable=g-import-not-at-top
  from bipe_jax.runs import run_logging  # pylint: disable=g-import-not-at-top
  del bucket  # gs:// is an in-memory store for this test
  tries = []

  def failing_flush(self, *, force=False):
    tries.append(force)
    raise storage_faults.StorageUnreachableError('storage unreachable: gs://b at http://x')

  # pylint: disable-next=protected-access
  handler = run_logging._ObjectLogHandler('gs://b/run/library.log')
  monkeypatch.setattr(storage.ChunkedAppender, 'flush', failing_flush)
  for level in (logging.WARNING, logging.ERROR, logging.INFO, logging.ERROR):
    handler.handle(logging.LogRecord('orbax', level, __file__, 1, 'save failed', None, None))
  assert tries == [True]  # the first warning's write only
  handler.close()
  handler.close()  # (logging.shutdown closes it again at exit)
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ['warning: the last lines of gs://b/run/library.log were not written: '
                 'storage unreachable: gs://b at http://x'], err


def test_a_failed_tensorboard_write_stops_the_loop_not_a_background_thread(
    bucket, monkeypatch):  # noqa: F811  pylint: disable=redefined-outer-name
  """The event file is written in the loop's thread: its failed write raises there (the run
  then stops with exit 74). tensorboardX's background writer ended on it instead, and the loop
  then waited for ever on its full queue (a run hung, the server killed under load)."""
  from bipe_jax import storage  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import progress  # pylint: disable=g-import-not-at-top
  del bucket  # gs:// is an in-memory store for this test
  flush = storage.ChunkedAppender.flush

  def events_fail(self, *, force=False):
    if '/tensorboard/' in self.path:
      raise storage_faults.StorageUnreachableError('storage unreachable: gs://b at http://x')
    flush(self, force=force)

  logger = progress.ProgressLogger('gs://b/run', total_steps=9, tokens_per_step=8,
                                   flops_per_token=1.0, peak_flops=0.0, log_every=1,
                                   enabled=True)
  logger.record(1, {'loss': 1.0, 'learning_rate': 1e-3})
  monkeypatch.setattr(storage.ChunkedAppender, 'flush', events_fail)
  with pytest.raises(storage_faults.StorageUnreachableError, match='gs://b'):
    logger.validation(1, 0.5, 10)  # a validation line flushes the events at once
