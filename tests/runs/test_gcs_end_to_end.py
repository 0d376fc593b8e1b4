"""A whole run on gs:// against fake-gcs-server on 127.0.0.1, unpatched (tests/gcs_server.py).

The runs, started as the command lines a user types, see only STORAGE_EMULATOR_HOST
(bipe_jax.storage points array_record's and Orbax's GCS clients at it too). Every path is a
gs:// URL, and each command runs in an empty local folder that must stay empty: a path that
bypassed bipe_jax.storage would leave a folder named `gs:` there. The objects each step must
write are checked in the bucket.

1. `train/build_data.py` builds the embedded corpus (the demo's: a train record file of ~3 MB,
   read back with the suffix range reads a record file over 1 MiB needs) into gs://.../data;
2. two `train/main.py` processes on 127.0.0.1 train in gs://.../run (synchronous checkpoints
   every 4 steps) and are killed (SIGKILL) after the first; one process resumes from it with the
   same command, repeating the killed run's losses, and is preempted (SIGTERM): it saves the step
   it reached, and the same command again finishes the run from there;
3. perplexity (JSON, plot, per-position plot), visualize (its default folder, in the run),
   the Hugging Face export, passkey, one CHE cell and the TPU compile write into the bucket;
4. docs/multihost.md's command of the paper preset (configs/paper_151m.py:bipe_rope), shrunk by
   flags, trains 3 steps on a Pile-format folder in the bucket (its data built into gs:// too).
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import portpicker
import pytest
from bipe_jax import cli as bipe_cli
from tests import fixtures
from tests import forkserver
from tests import gcs_server

pytestmark = [pytest.mark.slow]

ROOT = fixtures.ROOT
BUCKET = 'bipe-e2e'
RUN = f'gs://{BUCKET}/run'
OUT = f'gs://{BUCKET}/out'
STEPS, EVERY = 12, 4
KILL_AFTER, TERM_AFTER = EVERY + 2, 2 * EVERY + 1  # steps printed before SIGKILL / SIGTERM


def script(*parts) -> str:
  return os.path.join(ROOT, *parts)


class Storage:
  """The server and a fresh empty local folder for each command (checked empty after it)."""

  def __init__(self, server: gcs_server.FakeGcsServer, tmp_path_factory):
    self.server, self.fs, self._tmp = server, server.fs, tmp_path_factory

  def env(self, devices=1) -> dict:
    return self.server.env(fixtures.cpu_env(devices))

  def cwd(self):
    return self._tmp.mktemp('cwd')

  def run(self, args, devices=1) -> str:
    """Runs the command (through the fork server) in an empty folder; its stdout."""
    cwd, start = self.cwd(), time.perf_counter()
    proc = forkserver.run(args, cwd=cwd, env=self.env(devices), capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f'{time.perf_counter() - start:.1f} s: {" ".join(args[1:3])}', file=sys.stderr)
    self.assert_nothing_local(cwd, args)
    return proc.stdout

  @staticmethod
  def assert_nothing_local(cwd, args):
    command = ' '.join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in args[1:])
    assert not os.path.exists(cwd / 'gs:'), f'wrote a local gs: folder: {command}'
    assert not os.listdir(cwd), f'{command} wrote {os.listdir(cwd)} locally'

  def objects(self, folder: str) -> set:
    """Names of the objects under gs://BUCKET/folder/, relative to it."""
    return {os.path.relpath(n, folder) for n in self.server.objects(folder + '/')}

  def read(self, url: str) -> bytes:
    return self.fs.cat(url.removeprefix('gs://'))


@pytest.fixture(scope='module')
def storage(tmp_path_factory):
  with gcs_server.FakeGcsServer(tmp_path_factory.mktemp('gcs') / 'root', bucket=BUCKET) as server:
    yield Storage(server, tmp_path_factory)
  for folder in (ROOT, os.getcwd()):
    assert not os.path.exists(os.path.join(folder, 'gs:')), f'a path bypassed storage in {folder}'


VOCAB = 512
DATA = ['--config.data.dataset=embedded', f'--config.data.data_dir=gs://{BUCKET}/data',
        f'--config.data.tokenizer_vocab_size={VOCAB}']
MODEL = [f'--config.model.vocab_size={VOCAB}', '--config.model.hidden_size=32',
         '--config.model.num_layers=1', '--config.model.num_heads=2',
         '--config.model.ffn_size=64', '--config.model.max_intra=32',
         '--config.model.max_position=32', '--config.model.block_size=16',
         '--config.data.seq_len=32']


def _train_args(*extra):
  """train/main.py with the tiny preset shrunk by flags, on the embedded corpus in the bucket."""
  return [sys.executable, script('train', 'main.py'), f'--config={script("configs", "tiny.py")}',
          f'--workdir={RUN}', *MODEL, *DATA, '--config.train.batch_size=4',
          f'--config.train.steps={STEPS}', '--config.train.schedule=constant',
          '--config.train.warmup_steps=2', '--config.train.log_every=1',
          f'--config.checkpoint.every_steps={EVERY}', '--config.checkpoint.async_save=false',
          '--config.train.data_shards=2', '--config.data.shuffle_window=8', *extra]


def _losses(storage, workdir=RUN) -> dict:
  """{step: loss} of metrics.jsonl in the bucket (all its parts, in order)."""
  parts = sorted(p for p in storage.objects(workdir.removeprefix(f'gs://{BUCKET}/'))
                 if p.startswith('metrics.jsonl'))
  rows = [json.loads(line) for p in parts
          for line in storage.read(f'{workdir}/{p}').decode().splitlines()]
  return {r['step']: r['loss'] for r in rows if 'loss' in r}


@pytest.fixture(scope='module')
def built(storage):
  """The embedded corpus and its tokenizer built into gs://BUCKET/data."""
  out = storage.run([sys.executable, script('train', 'build_data.py'),
                     f'--data_dir=gs://{BUCKET}/data', f'--vocab_size={VOCAB}',
                     '--count_tokens=false'])
  assert 'embedded: built in gs://' in out, out
  return storage


def test_build_data_writes_the_embedded_corpus_into_the_bucket(built):
  names = built.objects('data')
  sizes = {n: built.fs.size(f'{BUCKET}/data/{n}') for n in names if '.array_record-' in n}
  assert any('-train.' in n and s > 2**21 for n, s in sizes.items()), sizes  # over 1 MiB
  assert any(n.endswith('dataset_info.json') for n in names), names
  assert any(n.endswith(f'spm_bpe_{VOCAB}.model') for n in names), names
  assert any(n.endswith('build_report.json') for n in names), names


def _popen(storage, args):
  """The command started in an empty folder (its `cwd`), output piped."""
  cwd = storage.cwd()
  proc = subprocess.Popen(args, cwd=cwd, env=storage.env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  proc.cwd = cwd
  return proc


def _signal_after(procs, step: int, signum, timeout: float = 400) -> str:
  """Reads the first process's output until it prints step `step`, sends `signum` to all,
  waits for their exit (all are killed after `timeout` seconds); the output read."""
  out = []
  watchdog = threading.Timer(timeout, lambda: [p.kill() for p in procs if p.poll() is None])
  watchdog.start()
  try:
    for line in procs[0].stdout:
      out.append(line)
      if line.startswith(f'step {step}/'):
        for proc in procs:
          proc.send_signal(signum)
        break
    out.extend(procs[0].stdout)
    for proc in procs:
      proc.wait(timeout=120)
  finally:
    watchdog.cancel()
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  return ''.join(out)


@pytest.fixture(scope='module')
def trained(built):
  """Two processes train into RUN and are killed (SIGKILL) after checkpoint 4; one process
  resumes and is preempted (SIGTERM) after step TERM_AFTER; the same command finishes.
  Returns (storage, {step: loss} after each of the three, the preempted run's output)."""
  storage = built
  port = portpicker.pick_unused_port()
  procs = [_popen(storage, _train_args(f'--coordinator_address=127.0.0.1:{port}',
                                       '--num_processes=2', f'--process_id={pid}'))
           for pid in range(2)]
  out = _signal_after(procs, KILL_AFTER, signal.SIGKILL)  # checkpoint 4 is saved before
  # step 5 starts, and step 5's metrics are written before step 6 is printed
  assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2, out[-3000:]
  for proc in procs:
    storage.assert_nothing_local(proc.cwd, proc.args)
  assert 'process 0 of 2 on ' in out, out[-3000:]
  killed = _losses(storage)
  proc = _popen(storage, _train_args())
  preempted_out = _signal_after([proc], TERM_AFTER, signal.SIGTERM)
  assert proc.returncode == bipe_cli.EXIT_PREEMPTED, preempted_out[-3000:]
  storage.assert_nothing_local(proc.cwd, proc.args)
  preempted = _losses(storage)
  out = storage.run(_train_args())
  assert f'resumed from checkpoint step {max(preempted)}' in out, out[-3000:]
  return storage, (killed, preempted, _losses(storage)), preempted_out


def test_two_processes_killed_then_one_resumes_exactly_and_sigterm_saves_its_step(trained):
  storage, (killed, preempted, final), preempted_out = trained
  assert sorted(killed)[:KILL_AFTER - 1] == list(range(1, KILL_AFTER)), killed
  assert f'resumed from checkpoint step {EVERY}' in preempted_out, preempted_out[-3000:]
  assert '1 processes' in preempted_out, preempted_out[-3000:]
  # one process repeats what the two computed (the same global batches: train.data_shards=2)
  repeated = [s for s in killed if s > EVERY]
  assert repeated
  np.testing.assert_allclose([preempted[s] for s in repeated], [killed[s] for s in repeated],
                             rtol=2e-5)
  # SIGTERM: the step reached is saved, and the next run starts from it
  stopped = max(preempted)
  assert TERM_AFTER <= stopped < STEPS, preempted
  assert f'preempted (SIGTERM) at step {stopped}' in preempted_out, preempted_out[-3000:]
  assert sorted(final) == list(range(1, STEPS + 1))  # the steps run again are logged once
  assert final[STEPS] < final[1]
  names = storage.objects('run')
  for expected in ('config.json', 'position_stats.json', 'tokenizer.model',
                   'library.log', 'library.1.log',  # each process its own log
                   f'checkpoints/{stopped}/commit_success.txt',
                   f'checkpoints/{STEPS}/commit_success.txt'):
    assert expected in names, sorted(names)
  # the three newest checkpoints are kept (checkpoint 4, the one resumed from, is gone)
  assert {n.split('/')[1] for n in names if n.startswith('checkpoints/')} == {
      str(2 * EVERY), str(stopped), str(STEPS)}, sorted(names)
  assert any(n.startswith('tensorboard/events.out.tfevents') for n in names), sorted(names)
  # each resumed run appended a new part; the killed run's first part was not rewritten whole
  assert {'metrics.jsonl', 'metrics.jsonl.000001', 'metrics.jsonl.000002'} <= names, sorted(names)


def test_perplexity_writes_its_json_plot_and_position_plot_into_the_bucket(trained):
  storage = trained[0]
  out = storage.run([sys.executable, script('eval', 'perplexity.py'), f'--workdir={RUN}',
                     '--lengths=32,64', '--max_tokens=2048', f'--output={OUT}/perplexity.json',
                     f'--plot={OUT}/perplexity.png', '--per_position',
                     f'--position_plot={OUT}/positions.png'])
  assert f'step {STEPS}' in out, out[-3000:]
  result = json.loads(storage.read(f'{OUT}/perplexity.json'))
  [run] = result['runs']
  assert run['workdir'] == RUN and [r['length'] for r in run['results']] == [32, 64], run
  for png in ('perplexity.png', 'positions.png'):
    assert storage.read(f'{OUT}/{png}')[:4] == b'\x89PNG', png


def test_visualize_writes_its_default_folder_in_the_run(trained):
  storage = trained[0]
  storage.run([sys.executable, script('eval', 'visualize.py'), f'--workdir={RUN}'])
  names = storage.objects('run/visualize')
  assert any(n.endswith('.json') for n in names) and any(n.endswith('.png') for n in names), names
  for png in (n for n in names if n.endswith('.png')):
    assert storage.read(f'{RUN}/visualize/{png}')[:4] == b'\x89PNG', png


def test_export_to_a_hugging_face_folder_in_the_bucket(trained):
  storage = trained[0]
  storage.run([sys.executable, '-m', 'bipe_jax.convert', '--from', RUN, '--to', f'{OUT}/hf'])
  hf = json.loads(storage.read(f'{OUT}/hf/config.json'))
  assert hf['hidden_size'] == 32 and hf['vocab_size'] == VOCAB, hf
  assert storage.fs.size(f'{BUCKET}/out/hf/model.safetensors') > 10_000
  assert storage.read(f'{OUT}/hf/tokenizer.model') == storage.read(f'{RUN}/tokenizer.model')


def test_passkey_writes_its_json_and_heat_map_into_the_bucket(trained):
  storage = trained[0]
  out = storage.run([sys.executable, script('eval', 'passkey.py'), f'--workdir={RUN}',
                     '--lengths=128', '--depths=0.5', '--trials=1', '--batch_size=1',
                     f'--output={OUT}/passkey.json', f'--plot={OUT}/passkey.png'])
  assert 'passkey retrieval' in out, out[-3000:]
  passkey = json.loads(storage.read(f'{OUT}/passkey.json'))
  assert passkey['runs'][0]['step'] == STEPS, passkey
  assert storage.read(f'{OUT}/passkey.png')[:4] == b'\x89PNG'


def test_che_cell_writes_its_cell_results_and_plot_into_the_bucket(storage):
  storage.run([sys.executable, script('eval', 'che.py'), '--task=parity_check',
               '--encoding=rope', '--seeds=0', '--steps=1', '--batch_size=2', '--eval_lengths=41',
               '--eval_samples=2', '--bucket=64', f'--output_dir={OUT}/che'])
  # (test_outputs_in_bucket.py's cell: the suite's compilation cache compiles it once)
  names = storage.objects('out/che')
  assert {'cells/parity_check__rope__seed0.json', 'results.json', 'table.md',
          'parity_check.png'} <= names, sorted(names)
  cell = json.loads(storage.read(f'{OUT}/che/cells/parity_check__rope__seed0.json'))
  assert set(cell['accuracy']) == {'41'}, cell


def test_compile_for_a_tpu_topology_writes_its_json_into_the_bucket(trained):
  pytest.importorskip('libtpu')
  storage = trained[0]
  storage.run([sys.executable, script('train', 'compile.py'),
               f'--config={script("configs", "tiny.py")}', *MODEL, '--config.train.batch_size=4',
               '--topology=v5e:2x2', '--nopredict', f'--output={OUT}/compile.json'])
  assert json.loads(storage.read(f'{OUT}/compile.json'))


def _documented_paper_command() -> list[str]:
  """docs/multihost.md's command of the paper preset shrunk by flags, as arguments run from an
  empty folder: the interpreter, absolute script and config paths, this test's bucket."""
  with open(os.path.join(ROOT, 'docs', 'multihost.md'), encoding='utf-8') as f:
    blocks = re.findall(r'```\n(.*?)```', f.read(), re.S)
  [block] = [b for b in blocks if b.startswith('STORAGE_EMULATOR_HOST=')]
  words = shlex.split(block.replace('\\\n', ' ').replace('BUCKET', BUCKET))
  assert words[:4] == ['STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT', 'python', 'train/main.py',
                       '--config=configs/paper_151m.py:bipe_rope'], words
  data = [f'--workdir=gs://{BUCKET}/paper_run', f'--config.data.pile_dir=gs://{BUCKET}/pile',
          f'--config.data.data_dir=gs://{BUCKET}/pile_data']
  assert words[4:] == [*data, *fixtures.PAPER_SHRUNK], words  # test_data_pile's shrunk run
  return [sys.executable, script(words[2]),
          f'--config={script("configs", "paper_151m.py")}:bipe_rope', *words[4:]]


def test_paper_preset_shrunk_by_flags_trains_3_steps_on_a_pile_folder_in_the_bucket(storage,
                                                                                    tmp_path):
  """docs/multihost.md's launch of the paper preset on a bucket, shrunk by flags: the
  Pile-format folder, the built data and its tokenizer (trained on the bucket's folder), the
  run: all gs://."""
  fixtures.make_pile_folder(tmp_path / 'pile')
  storage.fs.put(str(tmp_path / 'pile'), f'{BUCKET}/pile', recursive=True)
  storage.run(_documented_paper_command())
  assert sorted(_losses(storage, f'gs://{BUCKET}/paper_run')) == [1, 2, 3]
  names = storage.objects('paper_run')
  assert {'config.json', 'checkpoints/3/commit_success.txt'} <= names, sorted(names)
  data = storage.objects('pile_data')
  assert any(n.startswith('bipe_pile/') and n.endswith('dataset_info.json') for n in data), data
  assert any('.array_record-' in n for n in data), data
  assert any(n.endswith('spm_bpe_300.model') for n in data), data
  config = json.loads(storage.read(f'gs://{BUCKET}/paper_run/config.json'))
  assert config['data']['dataset'] == 'pile', config['data']
  assert config['data']['pile_dir'] == f'gs://{BUCKET}/pile', config['data']
  # the preset's encoding, and settings the flags left as the preset has them
  assert config['model']['position_encoding'] == 'bipe_rope', config['model']
  assert config['model']['separators'] == 'auto', config['model']
  assert (config['train']['learning_rate'], config['train']['b2']) == (1e-4, 0.98)
