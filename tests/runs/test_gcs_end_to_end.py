"""A whole run on gs:// against a real storage server on 127.0.0.1 (a GCS emulator).

The emulator (`gcp-storage-emulator`, requirements-interop.txt) serves the GCS JSON API from a
thread of this test on a free port; the runs, started as the command lines a user types, see
only STORAGE_EMULATOR_HOST (bipe_jax.storage points array_record's and Orbax's GCS clients
at it too). Every path is a gs:// URL except the JAX compile cache, and each command runs in an
empty local folder: a path that bypassed the I/O layer would leave a folder named `gs:` there
(or fail), and the objects each step must write are checked in the bucket.

1. `train/build_data.py` builds a text folder (itself in the bucket) into gs://.../data;
2. two `train/main.py` processes on 127.0.0.1 train in gs://.../run (synchronous checkpoints
   every 4 steps) and are killed (SIGKILL) after the first; one process resumes from it with the
   same command and repeats the killed run's losses;
3. one more process evaluates perplexity, runs passkey, exports to a Hugging Face folder and
   compiles the run's config for a TPU topology, each writing its output into the bucket;
4. docs/multihost.md's command of the paper preset (configs/paper_151m.py:bipe_rope), shrunk by
   flags, trains 3 steps on a Pile-format folder in the bucket (its data built into gs:// too).
"""

import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest
from tests import fixtures
from tests import forkserver

pytestmark = [pytest.mark.slow]

ROOT = fixtures.ROOT
BUCKET = 'bipe-e2e'
STEPS, EVERY = 8, 4
WORDS = ('the a model token segment position sentence encoding length train test data value '
         'code line word').split()


def _documents():
  rng = np.random.default_rng(0)
  for d in range(40):
    lines = [' '.join(rng.choice(WORDS, rng.integers(3, 10))).capitalize()
             + str(rng.choice(['.', '!', '?'])) for _ in range(rng.integers(5, 15))]
    yield f'doc{d:03d}.txt', '\n'.join(lines) + '\n'


def _send_generations(server_module, objects_module):
  """gcp-storage-emulator leaves out the `x-goog-generation` header of a download, which GCS
  sends and tensorstore (Orbax's OCDBT checkpoints) reads ("Malformed StorageGeneration"): its
  download handler gets it added. Returns a function that undoes this."""
  original = objects_module.download

  def download(request, response, storage, *args, **kwargs):
    original(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params['bucket_name'], request.params['object_id'])
    except Exception:  # pylint: disable=broad-except  (the original answered 404)
      return
    response['x-goog-generation'] = obj['generation']
    response['x-goog-metageneration'] = obj['metageneration']

  handlers = server_module.HANDLERS
  objects_module.download = download
  server_module.HANDLERS = tuple(
      (pattern, {m: download if f is original else f for m, f in methods.items()})
      for pattern, methods in handlers)

  def undo():
    objects_module.download, server_module.HANDLERS = original, handlers
  return undo


@pytest.fixture(scope='module')
def storage(tmp_path_factory):
  """(emulator URL, gcsfs filesystem on it, empty local folder the commands run in)."""
  pytest.importorskip('gcp_storage_emulator')
  import gcsfs  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator import server as emulator  # pylint: disable=g-import-not-at-top
  from gcp_storage_emulator.handlers import objects  # pylint: disable=g-import-not-at-top
  undo = _send_generations(emulator, objects)
  port = portpicker.pick_unused_port()
  srv = emulator.create_server('127.0.0.1', port, in_memory=True, default_bucket=BUCKET)
  srv.start()
  # clients that close a connection early (tensorstore does) and lookups of objects not yet
  # written are normal: no traceback or error line each time
  srv._api._httpd.handle_error = lambda request, address: None  # pylint: disable=protected-access
  logging.getLogger('gcp_storage_emulator').setLevel(logging.CRITICAL)
  url = f'http://127.0.0.1:{port}'
  fs = gcsfs.core.GCSFileSystem(endpoint_url=url, token='anon', skip_instance_cache=True)
  for name, text in _documents():
    fs.pipe(f'{BUCKET}/text/{name}', text.encode('utf-8'))
  cwd = tmp_path_factory.mktemp('gcs_cwd')
  try:
    yield url, fs, cwd
  finally:
    srv.stop()
    undo()
  for folder in (cwd, ROOT, os.getcwd()):
    assert not os.path.exists(os.path.join(folder, 'gs:')), f'a path bypassed epath in {folder}'
  assert set(os.listdir(cwd)) <= {'jax_cache'}, os.listdir(cwd)


def _env(url, cwd, devices=1):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('CLOUD_STORAGE_EMULATOR', 'TENSORSTORE_GCS', 'GOOGLE_AUTH_TOKEN'))}
  env.update(STORAGE_EMULATOR_HOST=url, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu',
             JAX_COMPILATION_CACHE_DIR=str(cwd / 'jax_cache'),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0',
             XLA_FLAGS=fixtures.xla_flags(devices))
  return env


DATA = [f'--config.data.dataset=text_folder', f'--config.data.text_dir=gs://{BUCKET}/text',
        f'--config.data.data_dir=gs://{BUCKET}/data', '--config.data.tokenizer_vocab_size=320']


def _train_args(workdir, *extra):
  return [sys.executable, os.path.join(ROOT, 'train', 'main.py'),
          f'--config={os.path.join(ROOT, "configs", "tiny.py")}', f'--workdir=gs://{BUCKET}/{workdir}',
          '--config.model.vocab_size=320', '--config.model.hidden_size=32',
          '--config.model.num_layers=1', '--config.model.num_heads=2',
          '--config.model.ffn_size=64', '--config.model.max_intra=32',
          '--config.model.max_position=32', '--config.model.block_size=16',
          '--config.data.seq_len=32', *DATA, '--config.train.batch_size=4',
          f'--config.train.steps={STEPS}', '--config.train.schedule=constant',
          '--config.train.warmup_steps=2', '--config.train.log_every=1',
          f'--config.checkpoint.every_steps={EVERY}', '--config.checkpoint.async_save=false',
          '--config.train.data_shards=2', '--config.data.shuffle_window=8', *extra]


def _run(args, url, cwd, devices=1):
  start = time.perf_counter()
  proc = forkserver.run(args, cwd=cwd, env=_env(url, cwd, devices), capture_output=True,
                        text=True, timeout=400)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  print(f'{time.perf_counter() - start:.1f} s: {" ".join(args[1:3])}', file=sys.stderr)
  return proc.stdout


def _losses(fs, workdir) -> dict:
  """{step: loss} of metrics.jsonl in the bucket (all its parts, in order)."""
  fs.invalidate_cache()
  parts = sorted(p for p in fs.ls(f'{BUCKET}/{workdir}') if '/metrics.jsonl' in p)
  rows = [json.loads(line) for p in parts for line in fs.cat(p).decode().splitlines()]
  return {r['step']: r['loss'] for r in rows if 'loss' in r}


@pytest.fixture(scope='module')
def built(storage):
  url, fs, cwd = storage
  out = _run([sys.executable, os.path.join(ROOT, 'train', 'build_data.py'),
              '--dataset=text_folder', f'--text_dir=gs://{BUCKET}/text',
              f'--data_dir=gs://{BUCKET}/data', '--vocab_size=320', '--count_tokens=false'],
             url, cwd)
  names = fs.find(f'{BUCKET}/data')
  assert any(n.endswith('dataset_info.json') for n in names), names
  assert any('.array_record-' in n for n in names) and any(
      n.endswith('spm_bpe_320.model') for n in names), names
  assert any(n.endswith('build_report.json') for n in names), out
  return storage


@pytest.fixture(scope='module')
def killed_and_resumed(built):
  """Two processes train into gs://.../run and are killed (SIGKILL) after checkpoint 4; one
  process resumes from it. Returns (storage, the killed run's {step: loss}, the final ones)."""
  url, fs, cwd = built
  port = portpicker.pick_unused_port()
  procs = [subprocess.Popen(
      _train_args('run', f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
                  f'--process_id={pid}'),
      cwd=cwd, env=_env(url, cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for pid in range(2)]
  out = []
  try:
    for line in procs[0].stdout:  # checkpoint 4 is saved synchronously before step 5 starts,
      out.append(line)  # and step 5's metrics are written before step 6 is printed
      if line.startswith(f'step {EVERY + 2}/'):
        for proc in procs:
          proc.send_signal(signal.SIGKILL)
        break
    for proc in procs:
      proc.wait(timeout=60)
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2, ''.join(out)[-3000:]
  assert 'process 0 of 2 on ' in ''.join(out), ''.join(out)[-3000:]
  before = _losses(fs, 'run')
  assert sorted(before)[:EVERY + 1] == list(range(1, EVERY + 2)), before
  out = _run(_train_args('run'), url, cwd)
  assert f'resumed from checkpoint step {EVERY}' in out and '1 processes' in out, out[-3000:]
  after = _losses(fs, 'run')
  return built, before, after


def test_two_processes_killed_then_one_resumes_exactly(killed_and_resumed):
  (_, fs, _), before, after = killed_and_resumed
  assert sorted(after) == list(range(1, STEPS + 1))  # the steps run again are logged once
  repeated = [s for s in before if s > EVERY]
  assert repeated
  # one process repeats what the two computed (the same global batches: train.data_shards=2)
  np.testing.assert_allclose([after[s] for s in repeated], [before[s] for s in repeated],
                             rtol=2e-5)
  assert after[STEPS] < after[1]
  names = {os.path.relpath(n, f'{BUCKET}/run') for n in fs.find(f'{BUCKET}/run')}
  for expected in ('config.json', 'position_stats.json', 'tokenizer.model',
                   'library.log', 'library.1.log',  # each process its own log
                   f'checkpoints/{EVERY}/commit_success.txt',
                   f'checkpoints/{STEPS}/commit_success.txt'):
    assert expected in names, sorted(names)
  assert any(n.startswith('tensorboard/events.out.tfevents') for n in names), sorted(names)
  # the resumed run appended a new part; the killed run's first part was not rewritten whole
  assert 'metrics.jsonl' in names and 'metrics.jsonl.000001' in names, sorted(names)


EVALUATE = '''
import sys
from bipe_jax.evaluation import cli
from bipe_jax.runs import restore as run_restore
from bipe_jax.interop import convert
from bipe_jax.compile import cli as compile_cli
run, out = sys.argv[1], sys.argv[2]
assert cli.perplexity_main(workdirs=[run], lengths='32,64', output=out + '/perplexity.json',
                           plot=out + '/perplexity.png') == 0
assert cli.passkey_main(workdirs=[run], lengths=[128], depths=[0.5], trials=1, batch_size=1,
                        output=out + '/passkey.json', plot_path=out + '/passkey.png') == 0
assert convert.main(['--from', run, '--to', out + '/hf']) == 0
config = run_restore.read_config(run)
assert compile_cli.run(config, 'v5e:2x2', output=out + '/compile.json') == 0
'''


def test_evaluate_passkey_export_and_compile_read_and_write_the_bucket(killed_and_resumed):
  (url, fs, cwd), _, _ = killed_and_resumed
  pytest.importorskip('libtpu')
  out = _run([sys.executable, '-c', EVALUATE, f'gs://{BUCKET}/run', f'gs://{BUCKET}/out'],
             url, cwd)
  assert f'step {STEPS}' in out and 'passkey retrieval' in out, out[-3000:]
  perplexity = json.loads(fs.cat(f'{BUCKET}/out/perplexity.json'))
  assert [r['length'] for r in perplexity['runs'][0]['results']] == [32, 64]
  assert perplexity['runs'][0]['workdir'] == f'gs://{BUCKET}/run'
  passkey = json.loads(fs.cat(f'{BUCKET}/out/passkey.json'))
  assert passkey['runs'][0]['step'] == STEPS
  hf = json.loads(fs.cat(f'{BUCKET}/out/hf/config.json'))
  assert hf['hidden_size'] == 32 and fs.size(f'{BUCKET}/out/hf/model.safetensors') > 10_000
  assert fs.cat(f'{BUCKET}/out/hf/tokenizer.model') == fs.cat(f'{BUCKET}/run/tokenizer.model')
  assert json.loads(fs.cat(f'{BUCKET}/out/compile.json'))
  for png in ('perplexity.png', 'passkey.png'):
    assert fs.cat(f'{BUCKET}/out/{png}')[:4] == b'\x89PNG'


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
  return [sys.executable, os.path.join(ROOT, words[2]),
          f'--config={os.path.join(ROOT, "configs", "paper_151m.py")}:bipe_rope', *words[4:]]


def test_paper_preset_shrunk_by_flags_trains_3_steps_on_a_pile_folder_in_the_bucket(storage,
                                                                                    tmp_path):
  """docs/multihost.md's launch of the paper preset on a bucket, shrunk by flags: the
  Pile-format folder, the built data and its tokenizer (trained on the bucket's folder), the
  run: all gs://."""
  url, fs, cwd = storage
  fixtures.make_pile_folder(tmp_path / 'pile')
  fs.put(str(tmp_path / 'pile'), f'{BUCKET}/pile', recursive=True)
  _run(_documented_paper_command(), url, cwd)
  assert sorted(_losses(fs, 'paper_run')) == [1, 2, 3]
  names = {os.path.relpath(n, f'{BUCKET}/paper_run') for n in fs.find(f'{BUCKET}/paper_run')}
  assert {'config.json', 'checkpoints/3/commit_success.txt'} <= names, sorted(names)
  data = fs.find(f'{BUCKET}/pile_data')
  assert any('/bipe_pile/' in n and n.endswith('dataset_info.json') for n in data), data
  assert any('.array_record-' in n for n in data), data
  assert any(n.endswith('spm_bpe_300.model') for n in data), data
  config = json.loads(fs.cat(f'{BUCKET}/paper_run/config.json'))
  assert config['data']['dataset'] == 'pile', config['data']
  assert config['data']['pile_dir'] == f'gs://{BUCKET}/pile', config['data']
  # the preset's encoding, and settings the flags left as the preset has them
  assert config['model']['position_encoding'] == 'bipe_rope', config['model']
  assert config['model']['separators'] == 'auto', config['model']
  assert (config['train']['learning_rate'], config['train']['b2']) == (1e-4, 0.98)
