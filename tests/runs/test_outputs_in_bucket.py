"""Every file a command line writes goes to the path it was given: with gs:// outputs, into the
bucket, and nothing into a local folder named `gs:` (what a plain `open` / `os.makedirs` /
`savefig` on 'gs://b/x' creates).

Three parts:
- no call that opens, makes or removes a file (`open`, `os.makedirs`, `savefig`, `shutil.*`,
  `json.dump`, ...) in bipe_jax/, eval/, train/ or benchmarks/ outside bipe_jax.storage, except
  the local-only ones listed with their reason (locks, /proc, the standard library's sources);
- the library's writers of results (plots, CHE cells and grids, Hugging Face folders, the
  demo's training log, the arithmetic sweep's curve, SCROLLS examples read back) against an
  in-memory filesystem bound to gs:// (tests/runs/test_workdir_remote.py's `bucket`), in an
  empty working directory;
- train/train_tokenizer.py --output=gs://... against fake-gcs-server on 127.0.0.1
  (tests/gcs_server.py) in an empty folder; the other command lines (eval/visualize.py with its
  default output folder, eval/perplexity.py --per_position --position_plot --output --plot,
  eval/passkey.py, eval/che.py, bipe_jax.convert, train/main.py, train/build_data.py) run the
  same way in tests/runs/test_gcs_end_to_end.py's walk.
"""

import ast
import json
import os
import sys
import time

import numpy as np
import pytest

from bipe_jax import storage
from bipe_jax.che import cell as che_cell
from bipe_jax.che import sweep as che_sweep
from bipe_jax.che import training as che_training
from bipe_jax.evaluation import position_plot
from bipe_jax.interop import hf_files
from tests import fixtures
from tests import forkserver
from tests.fixtures import dirs  # noqa: F401  pylint: disable=unused-import
from tests.gcs_server import gcs_server  # noqa: F401  pylint: disable=unused-import
from tests.runs.test_workdir_remote import bucket  # noqa: F401  pylint: disable=unused-import

PNG = b'\x89PNG\r\n\x1a\n'
ROOT = fixtures.ROOT


def _object(store, path) -> bytes:
  return store[path].getvalue()


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
  """An empty working directory; after the test it must still be empty (no local `gs:`)."""
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  yield cwd
  assert sorted(os.listdir(cwd)) == []


# ----------------------------------------------------------------------------------------------
# No file call outside the storage layer

# Calls that touch files without bipe_jax.storage; any other in bipe_jax/, eval/, train/ or
# benchmarks/ fails the test below. (file, call) -> why it may stay.
LOCAL_ONLY = {
    ('bipe_jax/storage.py', 'open'): 'the storage layer itself',
    ('bipe_jax/storage.py', 'os.makedirs'): 'the storage layer itself',
    ('bipe_jax/storage.py', 'os.replace'): 'the storage layer itself',
    ('bipe_jax/storage.py', 'savefig'): 'the storage layer itself (into a buffer)',
    ('bipe_jax/storage.py', 'shutil.copyfileobj'): 'the storage layer itself',
    ('bipe_jax/storage_faults.py', 'open'): 'the storage layer: a local folder\'s write probe',
    ('bipe_jax/storage_faults.py', 'os.remove'): 'the storage layer: a local folder\'s write probe',
    ('bipe_jax/runs/workdir_lock.py', 'os.open'): 'flock of a local workdir (skipped on gs://)',
    ('bipe_jax/runs/workdir_lock.py', 'os.makedirs'): 'flock of a local workdir',
    ('bipe_jax/data/preparation.py', 'open'): 'flock of a local data_dir (skipped on gs://)',
    ('bipe_jax/data/preparation.py', 'os.makedirs'): 'flock of a local data_dir',
    ('bipe_jax/che/sweep.py', 'os.makedirs'): 'a local queue_dir (gs:// refused: no atomic mkdir)',
    ('bipe_jax/che/sweep.py', 'os.mkdir'): 'a claim in a local queue_dir, made atomically',
    ('bipe_jax/runs/run_logging.py', 'os.makedirs'): 'the local log file\'s handler (gs:// has '
                                                     'its own, through storage)',
    ('bipe_jax/data/embedded_corpus.py', 'open'): "reads the installed Python's own sources",
    ('bipe_jax/platforms.py', 'open'): 'reads /sys/bus/pci device ids',
    ('benchmarks/common.py', 'open'): 'reads /proc (memory, CPU model)',
    ('benchmarks/profile_step.py', 'tempfile.mkdtemp'): "a local folder for JAX's profiler trace",
    ('benchmarks/profile_step.py', 'gzip.open'): "reads that local trace",
}
FILE_CALLS = ('open', 'os.open', 'os.makedirs', 'os.mkdir', 'os.replace', 'os.rename',
              'os.remove', 'os.unlink', 'os.rmdir', 'json.dump', 'np.save', 'np.savez',
              'np.savetxt', 'gzip.open', 'io.open', 'tempfile.mkdtemp')


def file_calls(source: str) -> set[str]:
  """The file calls of FILE_CALLS, `shutil.*` and `*.savefig` in Python `source`."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Call):
      continue
    func, name = node.func, None
    if isinstance(func, ast.Name):
      name = func.id
    elif isinstance(func, ast.Attribute):
      name = ('savefig' if func.attr == 'savefig' else
              f'{func.value.id}.{func.attr}' if isinstance(func.value, ast.Name) else None)
    if name in FILE_CALLS or name == 'savefig' or (name or '').startswith('shutil.'):
      found.add(name)
  return found


def test_the_file_call_finder_sees_writes_and_not_names():
  source = ('import os, shutil\nopen("x", "w")\nos.makedirs(d)\nfig.savefig(p)\n'
            'shutil.copyfile(a, b)\nstorage.write_json(p, {})\nopen_lines(p)\n'
            'text = "open(p)"\n')
  assert file_calls(source) == {'open', 'os.makedirs', 'savefig', 'shutil.copyfile'}


def test_every_file_call_outside_the_storage_layer_is_a_listed_local_one():
  found = set()
  for top in ('bipe_jax', 'eval', 'train', 'benchmarks'):
    for folder, _, names in os.walk(os.path.join(ROOT, top)):
      for name in names:
        if name.endswith('.py'):
          path = os.path.join(folder, name)
          with open(path, encoding='utf-8') as f:
            found |= {(os.path.relpath(path, ROOT), call) for call in file_calls(f.read())}
  assert sorted(found - set(LOCAL_ONLY)) == []  # through bipe_jax.storage instead
  assert sorted(set(LOCAL_ONLY) - found) == []  # a listed call that is gone: drop its line


# ----------------------------------------------------------------------------------------------
# The library's writers, against an in-memory gs://


def test_a_figure_and_json_are_written_into_the_bucket_through_a_buffer(bucket, empty_cwd):  # pylint: disable=redefined-outer-name,unused-argument
  curves = {'rope': ([2.0, 4.0, 6.0, 8.0], [1, 2, 2, 2])}
  assert position_plot.plot_position_loss(curves, 'gs://b/out/pos.png') == 'gs://b/out/pos.png'
  assert _object(bucket, 'gs://b/out/pos.png').startswith(PNG)
  storage.write_json('gs://b/out/doc.json', {'b': 1, 'a': [1, 2]}, indent=None, sort_keys=True)
  assert _object(bucket, 'gs://b/out/doc.json') == b'{"a": [1, 2], "b": 1}'


def test_json_and_text_are_replaced_atomically_on_a_local_disk(tmp_path):
  path = str(tmp_path / 'new' / 'folder' / 'doc.json')
  storage.write_json(path, {'z': 1, 'a': 2}, indent=1, sort_keys=True)
  assert open(path, encoding='utf-8').read() == '{\n "a": 2,\n "z": 1\n}'
  storage.write_text_atomic(path, 'second')
  assert open(path, encoding='utf-8').read() == 'second'
  assert os.listdir(os.path.dirname(path)) == ['doc.json']  # no temporary file left


def _fake_cell(task, encoding, seed, budget, plan, *, segmentation='task', **unused):
  del unused  # the progress callback, options left at their defaults
  accuracy = {str(n): 0.5 + 0.1 * seed for n in (1, 2, 41)}
  return dict(task=task, level='R', encoding=encoding, seed=seed,
              segmentation=che_cell.segmentation_of(encoding, segmentation),
              score=0.25 + 0.5 * seed, in_distribution=0.9, scored_lengths='1-2,41',
              accuracy=accuracy, budget=che_cell.dataclasses.asdict(budget),
              eval=che_cell.dataclasses.asdict(plan))


def test_a_che_grid_writes_its_cells_and_summary_into_the_bucket_and_resumes(
    bucket, empty_cwd, monkeypatch):  # pylint: disable=redefined-outer-name,unused-argument
  budget, plan = che_training.Budget(steps=2), che_cell.EvalPlan(lengths='1-2,41')
  monkeypatch.setattr(che_cell, 'run_cell', _fake_cell)
  grid = 'gs://b/grid'
  summary = che_sweep.run_grid(['parity_check'], ['rope'], [0, 1], budget, plan, grid,
                               say=lambda _: None)
  for seed in (0, 1):
    cell = json.loads(_object(bucket, f'{grid}/cells/parity_check__rope__seed{seed}.json'))
    assert cell['score'] == 0.25 + 0.5 * seed and cell['command'] == ''
  assert json.loads(_object(bucket, f'{grid}/results.json'))['table'] == summary['table']
  # score x 100 over seeds 0 and 1: mean 50.0, population std 25.0
  assert '| parity_check | R | 50.0 ± 25.0 (2) |' in _object(bucket, f'{grid}/table.md').decode()
  assert _object(bucket, f'{grid}/parity_check.png').startswith(PNG)

  def refuse(*args, **kwargs):
    raise AssertionError('a finished cell in the bucket was trained again')
  monkeypatch.setattr(che_cell, 'run_cell', refuse)
  again = che_sweep.run_grid(['parity_check'], ['rope'], [0, 1], budget, plan, grid,
                             say=lambda _: None)
  assert again['table'] == summary['table']
  with pytest.raises(ValueError, match='--queue_dir=gs://b/queue: a claim is a directory'):
    che_sweep.run_grid(['parity_check'], ['rope'], [0], budget, plan, grid,
                       queue_dir='gs://b/queue')


def test_a_hugging_face_folder_round_trips_through_the_bucket(bucket, empty_cwd):  # pylint: disable=redefined-outer-name,unused-argument
  weights = {'model.embed_tokens.weight': np.arange(6, dtype=np.float32).reshape(2, 3),
             'lm_head.weight': np.full((2, 3), -1.5, np.float32)}
  config = {'hidden_size': 3, 'auto_map': {'AutoModelForCausalLM': 'modeling_bipe.Bipe'}}
  hf_files.write_hf_folder('gs://b/hf', config, weights)
  assert hf_files.read_hf_config('gs://b/hf') == config
  assert _object(bucket, 'gs://b/hf/modeling_bipe.py') == storage.read_bytes(
      hf_files.MODELING_SOURCE)
  back = hf_files.read_hf_weights('gs://b/hf')
  assert sorted(back) == sorted(weights)
  for name, value in weights.items():
    np.testing.assert_array_equal(back[name], value)
  with pytest.raises(ValueError, match="not a Hugging Face model folder: 'gs://b/none'"):
    hf_files.read_hf_config('gs://b/none')


def test_the_demo_copies_a_training_log_into_the_bucket_line_by_line(bucket, empty_cwd):  # pylint: disable=redefined-outer-name,unused-argument
  from bipe_jax.evaluation import demo  # pylint: disable=g-import-not-at-top
  lines = [f'line {i}\n' for i in range(5)]
  with storage.open_append('gs://b/run/train.log') as sink:
    demo._copy_lines(iter(lines), sink)  # pylint: disable=protected-access
  assert storage.read_appended('gs://b/run/train.log') == ''.join(lines)


def test_the_demo_log_copier_reads_to_the_end_when_the_log_cannot_be_written(capsys):
  from bipe_jax.evaluation import demo  # pylint: disable=g-import-not-at-top

  class Gone:
    path = 'gs://b/run/train.log'
    writes = 0

    def write(self, line):
      del line
      self.writes += 1
      raise OSError('bucket gone')

    def flush(self):
      pass

  lines = iter([f'line {i}\n' for i in range(1000)])
  sink = Gone()
  demo._copy_lines(lines, sink)  # pylint: disable=protected-access
  assert next(lines, None) is None and sink.writes == 1  # drained; tried once
  err = capsys.readouterr().err
  assert err == ('warning: gs://b/run/train.log: the training log stops here: bucket gone\n')


def test_a_demo_training_run_keeps_its_command_and_log_in_the_bucket(bucket, empty_cwd,  # pylint: disable=redefined-outer-name,unused-argument
                                                                     monkeypatch):
  """The training subprocess's stderr reaches <workdir>/train.log through storage, and a failed
  run's error quotes the log's end."""
  from bipe_jax.evaluation import demo  # pylint: disable=g-import-not-at-top
  failing = [sys.executable, '-c', 'import sys; print("step 1"); '
             '[print(f"err {i}", file=sys.stderr) for i in range(20)]; sys.exit(3)']
  monkeypatch.setattr(demo.DemoPlan, 'train_command', lambda self, encoding: failing)
  plan = demo.DemoPlan(encodings=('rope',), output_dir='gs://b/demo', steps=2)
  printed = []
  with pytest.raises(RuntimeError, match='exit code 3') as error:
    demo.train_run(plan, 'rope', printed.append)
  workdir = plan.workdir('rope')
  assert workdir.startswith('gs://b/demo/runs/')
  assert storage.read_appended(f'{workdir}/train.log') == ''.join(
      f'err {i}\n' for i in range(20))
  assert 'err 19' in str(error.value) and 'err 4\n' not in str(error.value)  # the last 15
  assert _object(bucket, f'{workdir}/command.txt').decode().startswith('python -c ')
  assert '[rope] step 1' in printed


def test_the_arithmetic_sweep_keeps_its_curve_in_the_bucket(bucket, empty_cwd):  # pylint: disable=redefined-outer-name,unused-argument
  from bipe_jax.evaluation import arithmetic_sweep as sweep  # pylint: disable=g-import-not-at-top
  from configs import arithmetic_tiny  # pylint: disable=g-import-not-at-top

  class Trained:
    preempted = False

  class Accuracy:
    def __init__(self, value):
      self.accuracy = value

  plan = sweep.SweepPlan(chunk_steps=10, max_steps=20)
  curve = sweep.train_to_convergence(
      arithmetic_tiny.get_config(), 'gs://b/sweep/run', plan,
      train_fn=lambda config, workdir: Trained(),
      accuracy_fn=lambda workdir, problems: [Accuracy(0.5)], log=lambda _: None)
  assert curve['steps'] == [10, 20] and curve['stopped'] == 'max_steps'
  assert json.loads(_object(bucket, f'gs://b/sweep/run/{sweep.CURVE_FILE}')) == curve


def test_scrolls_examples_are_read_from_the_bucket(bucket, empty_cwd):  # pylint: disable=redefined-outer-name,unused-argument
  from bipe_jax.tasks import scrolls  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  rows = [{'id': 'a', 'pid': 'a0', 'input': 'question one', 'output': 'yes'},
          {'id': 'b', 'pid': 'b0', 'input': 'question two', 'output': 'no'}]
  storage.write_text_atomic('gs://b/scrolls/train.jsonl',
                            '\n'.join(json.dumps(r) for r in rows) + '\n')
  config = base.data_defaults()
  config.dataset = 'scrolls'
  config.scrolls_jsonl, config.seq_len = 'gs://b/scrolls', 512
  got = scrolls.read_examples(config, 'train')
  assert got == [{k: r[k] for k in scrolls.FIELDS} for r in rows]


# ----------------------------------------------------------------------------------------------
# The command lines, against fake-gcs-server


def _cli(server, tmp_path, name, args, timeout=300):
  """Runs `python args...` in an empty folder with the server's environment; returns stdout.
  Fails unless it exits 0 and leaves the folder empty (no local `gs:`, nothing else)."""
  cwd = tmp_path / name
  cwd.mkdir()
  env = server.env(fixtures.cpu_env(), PYTHONPATH=ROOT)
  start = time.perf_counter()
  proc = forkserver.run([sys.executable, *args], cwd=str(cwd), env=env, capture_output=True,
                        text=True, timeout=timeout)
  print(f'{time.perf_counter() - start:.1f} s: {name}', file=sys.stderr)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert sorted(os.listdir(cwd)) == [], (name, os.listdir(cwd))
  return proc.stdout


def test_the_tokenizer_command_line_writes_into_the_bucket(gcs_server, tmp_path, dirs):  # pylint: disable=redefined-outer-name
  """(The evaluation, CHE and export command lines write into the bucket in
  tests/runs/test_gcs_end_to_end.py's walk, each in an empty folder too.)"""
  server = gcs_server
  gs = f'gs://{server.bucket}'
  _cli(server, tmp_path, 'tokenizer',
       [os.path.join(ROOT, 'train', 'train_tokenizer.py'), '--dataset=text_folder',
        f'--text_dir={dirs / "text"}', f'--data_dir={tmp_path / "data"}', '--vocab_size=300',
        f'--output={gs}/tokenizer/spm.model'])
  assert 'tokenizer/spm.model' in server.objects()
  assert len(server.fs.cat(f'{server.bucket}/tokenizer/spm.model')) > 1000
