"""What a person watching a run sees: the window-averaged loss and validation during training."""

import contextlib
import io
import json
import struct
import threading

import numpy as np
import pytest

import bipe_jax.data as data_lib
from bipe_jax.evaluation import perplexity
from bipe_jax.runs import restore as runs_lib
from bipe_jax import run_config
from bipe_jax.training import progress
from bipe_jax.training import trainer
from configs import base
from tests.data import test_data_builders as corpus


def test_progress_line_shows_the_window_mean_loss(tmp_path, capsys):
  logger = progress.ProgressLogger(str(tmp_path), total_steps=6, tokens_per_step=10,
                                   flops_per_token=1.0, peak_flops=1e9, log_every=3,
                                   enabled=True)
  losses = [6.0, 5.0, 1.0, 4.0, 2.0, 3.0]
  logged = [logger.record(s, {'loss': l, 'learning_rate': 1e-3})
            for s, l in enumerate(losses, 1)]
  logger.close()
  assert [m is not None for m in logged] == [False, False, True, False, False, True]
  assert logged[2]['loss'] == pytest.approx(4.0) and logged[2]['step_loss'] == 1.0
  assert logged[5]['loss'] == pytest.approx(3.0) and logged[5]['step_loss'] == 3.0
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith('step 3/6 | loss 4.0000 |') and out[1].startswith('step 6/6 | loss 3.0000')
  rows = [json.loads(l) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [(r['step'], r['loss'], r['loss_window_steps']) for r in rows] == [(3, 4.0, 3),
                                                                          (6, 3.0, 3)]


@pytest.fixture(scope='module')
def folder_run(tmp_path_factory):
  """A 4-step tiny run on a generated text folder with validation every 2 steps."""
  root = tmp_path_factory.mktemp('validation')
  corpus.write_corpus(root / 'texts', 24)
  config = base.get_base_config()
  config.data = corpus.folder_config(root / 'texts', root / 'data', tokenizer_vocab_size=320,
                                     seq_len=16, num_threads=0, prefetch=0, shuffle_window=64)
  m = config.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.ffn_size = 320, 32, 2, 4, 64
  m.max_intra = m.max_position = m.block_size = 16
  t = config.train
  t.steps, t.batch_size, t.log_every, t.warmup_steps = 4, 4, 2, 1
  t.eval_every, t.eval_tokens = 2, 160
  config.checkpoint.every_steps = 4
  config.checkpoint.async_save = False
  workdir = root / 'run'
  with contextlib.redirect_stdout(io.StringIO()) as printed:
    trainer.train(config, str(workdir))
  (root / 'printed.txt').write_text(printed.getvalue())  # the run's start line and progress
  return config, workdir


def test_the_run_records_the_attention_it_chose(folder_run):
  """model.attention_impl='auto' (the default; the config sets nothing) is resolved for the
  mesh's devices: config.json and the start line name what the step runs."""
  config, workdir = folder_run
  assert config.model.attention_impl == 'auto'
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['model']['attention_impl'] == 'blockwise'  # on CPU devices
  start = [l for l in (workdir.parent / 'printed.txt').read_text().splitlines()
           if l.startswith('mesh ')]
  assert len(start) == 1 and start[0].endswith('; attention blockwise (auto on this platform)')


def test_validation_every_n_steps_on_a_fixed_slice(folder_run, capsys):
  config, workdir = folder_run
  rows = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  val = [r for r in rows if 'val_loss' in r]
  assert [r['step'] for r in val] == [2, 4]
  assert all(r['val_tokens'] == 150 for r in val)  # 10 blocks of 16: 15 targets each
  assert val[1]['val_perplexity'] == pytest.approx(np.exp(val[1]['val_loss']))
  # The same slice scored independently from the saved step-4 checkpoint.
  run = runs_lib.load_run(str(workdir))
  tokens, mask = data_lib.make_eval_blocks(config.data, 16, max_tokens=160)
  with run.context():
    want = perplexity.score_blocks(run.apply_fn(), run.params, tokens, mask, batch_size=4)
  assert val[1]['val_loss'] == pytest.approx(want.nll, rel=1e-5)


def test_a_slice_shorter_than_one_block_is_a_config_error(folder_run, tmp_path):
  config, _ = folder_run
  config = config.copy_and_resolve_references()
  config.train.eval_tokens = 8
  with pytest.raises(run_config.ConfigError, match='train.eval_tokens=8'):
    trainer.train(config, str(tmp_path / 'bad'))


@pytest.mark.parametrize('kind,platform,dtype,value,fragment', [
    ('NVIDIA H100 80GB HBM3', 'gpu', 'bfloat16', 989e12, 'bfloat16 peak of NVIDIA H100'),
    ('NVIDIA H200', 'gpu', 'float32', 494e12, 'float32 (TF32'),
    ('NVIDIA A100-SXM4-80GB', 'gpu', 'bfloat16', 312e12, 'A100'),
    ('TPU v4', 'tpu', 'bfloat16', 275e12, 'TPU v4'),
    ('TPU v5 lite', 'tpu', 'bfloat16', 197e12, 'TPU v5 lite'),
    ('TPU v5p', 'tpu', 'float32', 459e12, 'TPU v5p'),
    ('TPU v6 lite', 'tpu', 'bfloat16', 918e12, 'TPU v6 lite'),
    ('cpu', 'cpu', 'float32', 2.0e11, 'per host'),
])
def test_mfu_peak_by_device_kind(kind, platform, dtype, value, fragment):
  from bipe_jax.training import flops  # pylint: disable=g-import-not-at-top
  peak, source = flops.peak_flops_per_device(kind, platform, dtype)
  assert peak == value and fragment in source
  assert flops.peak_flops_per_device(kind, platform, dtype, 5e12) == (
      5e12, '5e+12 FLOP/s per device (train.peak_flops_per_device)')


def test_unknown_accelerator_reports_no_mfu(tmp_path):
  from bipe_jax.training import flops  # pylint: disable=g-import-not-at-top
  peak, source = flops.peak_flops_per_device('Some NPU', 'npu', 'bfloat16')
  assert peak == 0 and 'MFU not reported' in source
  logger = progress.ProgressLogger(str(tmp_path), total_steps=2, tokens_per_step=10,
                                   flops_per_token=1.0, peak_flops=peak, log_every=1,
                                   enabled=False)
  logger.record(1, {'loss': 1.0, 'learning_rate': 1e-3})
  metrics = logger.record(2, {'loss': 1.0, 'learning_rate': 1e-3})
  assert 'mfu' not in metrics and 'MFU' not in progress.format_line(2, 2, metrics)


def test_the_tensorboard_writer_is_imported_without_pytorch():
  """tensorboardX imports torch when it is installed (3-4 s of every run's start-up); the
  logger imports it with torch blocked, and torch stays importable afterwards (the suite's
  environment has torch: requirements-interop.txt)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from tests import fixtures  # pylint: disable=g-import-not-at-top
  code = ('import sys\n'
          'from bipe_jax.training import event_file\n'
          'assert event_file.import_tensorboardx()[0].__name__ == "EventsWriter"\n'
          'print("torch" in sys.modules)\n'
          'import torch\n'
          'print(torch.__name__)\n')
  proc = subprocess.run([sys.executable, '-c', code], cwd=fixtures.ROOT, env=fixtures.cpu_env(),
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ['False', 'torch'], proc.stdout


def _read_events(path) -> list:
  """The Event protos of a TFRecord event file, read by hand: each record is its length (8
  bytes), a CRC (4), the data and a CRC (4)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  data, events, at = path.read_bytes(), [], 0
  while at < len(data):
    (length,) = struct.unpack('Q', data[at:at + 8])
    events.append(event_pb2.Event.FromString(data[at + 12:at + 12 + length]))
    at += 12 + length + 4
  return events


def test_tensorboard_scalars_are_written_in_the_loop_thread_and_read_back(tmp_path):
  """No background writer (its thread ended on a failed bucket write, then the loop waited on
  its full queue for ever): the logger starts no thread, and the file holds every scalar with
  its step."""
  before = threading.active_count()
  logger = progress.ProgressLogger(str(tmp_path), total_steps=4, tokens_per_step=10,
                                   flops_per_token=1.0, peak_flops=1e9, log_every=2,
                                   enabled=True)
  for step in range(1, 5):
    logger.record(step, {'loss': float(step), 'learning_rate': 1e-3})
  logger.validation(4, 0.5, 100)
  assert threading.active_count() == before
  logger.close()
  (path,) = (tmp_path / 'tensorboard').glob('events.out.tfevents*')
  events = _read_events(path)
  assert events[0].file_version == 'brain.Event:2'
  scalars = {(e.step, v.tag): v.simple_value for e in events[1:] for v in e.summary.value}
  assert scalars[2, 'train/loss'] == pytest.approx(1.5)  # the window mean of steps 1, 2
  assert scalars[4, 'train/step_loss'] == 4.0
  assert scalars[4, 'validation/loss'] == 0.5
  assert {s for s, _ in scalars} == {2, 4}
