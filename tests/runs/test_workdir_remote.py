"""A run's workdir on a bucket: every workdir file goes through etils.epath.

How: `gs://bucket/...` paths resolve to etils.epath's fsspec backend (tensorflow is not
installed; the test forces that backend in any case), and fsspec's 'gcs' protocol is replaced by
an in-memory filesystem (fsspec's MemoryFileSystem under the gs/gcs protocol names). So the
library sees a real non-posix epath backend, and no network is touched. A write through plain
`open()`/`os` would land on the local disk (or fail), not in the in-memory store.
"""

import json
import os

import numpy as np
import pytest
from etils.epath import backend as epath_backend
from etils.epath import gpath
import fsspec
from fsspec.implementations.memory import MemoryFileSystem

from bipe_jax.runs import restore as run_restore
from bipe_jax.runs import tokenizer as run_tokenizer
from bipe_jax import storage
from bipe_jax.data import tokenizer as tokenizer_lib
from bipe_jax.state import checkpointing
from bipe_jax.runs import position_stats
from bipe_jax.training import progress
from bipe_jax.runs import run_record
from bipe_jax.runs import workdir_lock
from configs import base
from tests.data import test_data_builders as corpus

RUN = 'gs://bucket/runs/tiny'


class InMemoryGCS(MemoryFileSystem):
  protocol = ('gs', 'gcs')
  store = {}  # its own store (not MemoryFileSystem's)
  pseudo_dirs = ['']


@pytest.fixture
def bucket(monkeypatch):
  """The in-memory store behind gs:// for this test: {path: file object}."""
  InMemoryGCS.store.clear()
  InMemoryGCS.pseudo_dirs[:] = ['']
  previous = {p: fsspec.registry.get(p) for p in ('gs', 'gcs')}
  fsspec.register_implementation('gcs', InMemoryGCS, clobber=True)
  fsspec.register_implementation('gs', InMemoryGCS, clobber=True)
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  monkeypatch.setattr(gpath, '_is_tf_installed', lambda: False)
  yield InMemoryGCS.store
  from bipe_jax import storage_gcs  # pylint: disable=g-import-not-at-top
  for protocol, implementation in previous.items():  # a class: replaces InMemoryGCS there
    fsspec.register_implementation(
        protocol, implementation or storage_gcs.BoundedGCSFileSystem, clobber=True)
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access


def _text(store, name):
  return store[f'{RUN}/{name}'].getvalue().decode('utf-8')


def test_the_backend_is_not_posix(bucket):
  from etils import epath
  assert epath.Path(RUN)._backend is epath_backend.fsspec_backend  # pylint: disable=protected-access
  assert not storage.is_local(RUN) and storage.absolute(RUN) == RUN


def test_config_run_record_and_position_stats_live_in_the_bucket(bucket):
  config = base.get_base_config()
  config.model.separator_ids = (3, 4)
  run_record.write_config(RUN, config)
  assert json.loads(_text(bucket, 'config.json'))['model']['separator_ids'] == [3, 4]
  assert run_record.read_saved_config(RUN)['model']['separator_ids'] == [3, 4]
  run_record.check_resume(RUN, config)  # the same run: resumable
  config.model.position_encoding = 'rope'
  with pytest.raises(run_record.ResumeMismatchError, match='model.position_encoding'):
    run_record.check_resume(RUN, config)
  assert run_restore.read_config(RUN).model.separator_ids == [3, 4]
  stats = {'segments_per_row': 7.5}
  position_stats.write(RUN, stats)
  assert position_stats.read(RUN) == stats and f'{RUN}/position_stats.json' in bucket
  assert not os.path.exists('gs:') and not os.path.exists('bucket')  # nothing went to local disk


def test_checkpoint_listing_reads_the_bucket(bucket):
  ckpt = f'{RUN}/checkpoints'
  for step, item in ((10, 'state'), (20, 'state'), (30, 'params')):
    storage.write_text_atomic(f'{ckpt}/{step}/{item}/_METADATA', '{}')
  storage.write_text_atomic(f'{ckpt}/40.orbax-checkpoint-tmp/state/_METADATA', '{}')
  assert sorted(checkpointing.step_dirs(ckpt)) == [10, 20, 30]
  assert checkpointing.params_only_step(ckpt) == 30
  assert checkpointing.step_dirs(f'{RUN}/nothing') == {}


def test_metrics_and_tensorboard_events_are_written_to_the_bucket(bucket, capsys):
  logger = progress.ProgressLogger(RUN, total_steps=3, tokens_per_step=8, flops_per_token=1.0,
                                   peak_flops=0.0, log_every=1, enabled=True)
  for step in (1, 2, 3):
    logger.record(step, {'loss': 4.0 - step, 'grad_norm': 1.0, 'learning_rate': 1e-3})
  logger.validation(3, 0.5, 100)
  rows = [json.loads(line) for line in _text(bucket, 'metrics.jsonl').splitlines()]
  assert [r['step'] for r in rows] == [1, 2, 3, 3] and rows[-1]['val_tokens'] == 100
  logger.close()
  events = [k for k in bucket if k.startswith(f'{RUN}/tensorboard/events.out.tfevents')]
  assert len(events) == 1 and len(bucket[events[0]].getvalue()) > 100
  # A resumed run appends to the same object.
  again = progress.ProgressLogger(RUN, total_steps=4, tokens_per_step=8, flops_per_token=1.0,
                                  peak_flops=0.0, log_every=1, enabled=True)
  again.record(4, {'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 1e-3})
  again.close()
  # ... in a new part: the first object is not written again
  assert [json.loads(l)['step'] for l in _text(bucket, 'metrics.jsonl.000001').splitlines()] == [4]
  assert [json.loads(l)['step'] for l in storage.read_appended(
      f'{RUN}/metrics.jsonl').splitlines()] == [1, 2, 3, 3, 4]
  # a resume from step 2 drops steps 3 and 4: only the parts that held them are rewritten
  resumed = progress.ProgressLogger(RUN, total_steps=4, tokens_per_step=8, flops_per_token=1.0,
                                    peak_flops=0.0, log_every=1, enabled=True)
  assert resumed.forget_after(2) == 3
  resumed.close()
  assert [json.loads(l)['step'] for l in storage.read_appended(
      f'{RUN}/metrics.jsonl').splitlines()] == [1, 2]
  capsys.readouterr()


def test_an_appended_object_is_written_in_parts_never_whole(bucket):
  path = f'{RUN}/log.txt'
  out = storage.ChunkedAppender(path, chunk_bytes=10)
  writes = []
  original = storage.epath.Path.write_bytes
  def spy(self, data):  # records (object, size) of every object write
    writes.append((os.fspath(self), len(data)))
    return original(self, data)
  storage.epath.Path.write_bytes = spy
  try:
    for i in range(7):
      out.write(f'line {i}\n')  # 7 bytes each
      out.flush()
    out.close()
  finally:
    storage.epath.Path.write_bytes = original
  assert storage.read_appended(path) == ''.join(f'line {i}\n' for i in range(7))
  assert storage.appended_parts(path) == [path] + [f'{path}.{k:06d}' for k in (1, 2, 3)]
  assert max(size for _, size in writes) == 14  # never more than one part (< 2 lines)
  assert [name for name, _ in writes].count(path) == 2  # part 0 written twice, then closed
  # a new appender (a resumed run) starts a new part; min_interval_s holds flushes back
  again = storage.ChunkedAppender(path, min_interval_s=3600)
  again.write('first\n')
  again.flush()  # written: nothing written yet by this appender
  again.write('second\n')
  again.flush()  # held back
  assert storage.read_appended(path).endswith('first\n')
  again.close()
  assert storage.appended_parts(path)[-1] == f'{path}.000004'
  assert storage.read_appended(path).endswith('first\nsecond\n')


def test_the_tokenizer_copy_is_pinned_in_the_bucket_and_loads_from_it(bucket, tmp_path):
  docs = corpus.write_corpus(tmp_path / 'texts', 40)
  source = str(tmp_path / 'tiny.model')
  local = tokenizer_lib.train_tokenizer(docs.values(), source, vocab_size=320)
  config = base.get_base_config()
  config.data.tokenizer_path = source
  pin = run_tokenizer.pin_for_training(config.data, RUN)
  pinned = f'{RUN}/tokenizer.model'
  assert pin == {'tokenizer_path': pinned, 'tokenizer_sha256': run_tokenizer.sha256_of(source)}
  assert config.data.tokenizer_path == source  # not edited: the run's resolved config records it
  with open(source, 'rb') as f:
    assert bucket[pinned].getvalue() == f.read()
  config.data.update(pin)
  assert run_tokenizer.tokenizer_for_run(RUN, config.data) == pinned
  remote = tokenizer_lib.Tokenizer(pinned)
  text = 'A line of text.\nAnother one.'
  np.testing.assert_array_equal(remote.encode(text), local.encode(text))


def test_the_workdir_lock_is_skipped_with_one_line_on_a_bucket(bucket, capsys):
  with workdir_lock.hold(RUN):
    with workdir_lock.hold(RUN):  # no lock to conflict with: both enter
      pass
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 2 and 'lock is skipped' in err[0] and RUN in err[0]
  assert not bucket  # no lock file written


def test_the_library_log_file_is_written_to_the_bucket(bucket):
  import logging
  from bipe_jax.runs import run_logging
  handler = run_logging.send_library_logs_to(f'{RUN}/library.log')
  try:
    assert f'{RUN}/library.log' not in bucket  # nothing before the first line
    logging.getLogger('bipe_jax.test').info('restored checkpoint 40')
    assert 'restored checkpoint 40' in _text(bucket, 'library.log')
  finally:
    logging.getLogger().removeHandler(handler)
    handler.close()


def test_the_storage_emulator_variable_points_every_gcs_client_at_it():
  assert storage.follow_storage_emulator({}) == {}
  env = {'STORAGE_EMULATOR_HOST': '127.0.0.1:9023', 'TENSORSTORE_GCS_HTTP_URL': 'http://x:1'}
  added = storage.follow_storage_emulator(env)
  assert added == {'CLOUD_STORAGE_EMULATOR_ENDPOINT': 'http://127.0.0.1:9023',
                   'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'emulator'}
  assert env['TENSORSTORE_GCS_HTTP_URL'] == 'http://x:1'  # what the user set is kept


def test_the_gs_protocols_are_bound_to_gcsfs_plain_filesystem():
  import gcsfs.core
  from bipe_jax import storage_gcs  # pylint: disable=g-import-not-at-top
  for protocol in ('gs', 'gcs'):  # not the extended one that probes gRPC first
    assert fsspec.get_filesystem_class(protocol) is storage_gcs.BoundedGCSFileSystem
  assert storage_gcs.BoundedGCSFileSystem.__mro__[1] is gcsfs.core.GCSFileSystem  # with bounds
  assert gcsfs.GCSFileSystem is gcsfs.core.GCSFileSystem


def test_a_folder_is_walked_and_copied_to_the_bucket_marker_last(bucket, tmp_path, monkeypatch):
  (tmp_path / 'src' / 'sub').mkdir(parents=True)
  (tmp_path / 'src' / '.hidden').mkdir()
  for rel, text in (('a.txt', 'aa'), ('sub/b.json', '{}'), ('sub/c.bin', 'ccc'),
                    ('.hidden/x', 'x'), ('sub/.y', 'y')):
    (tmp_path / 'src' / rel).write_text(text)
  files = storage.walk_files(str(tmp_path / 'src'))
  assert [(rel, size) for rel, size, _ in files] == [('a.txt', 2), ('sub/b.json', 2),
                                                     ('sub/c.bin', 3)]
  assert files[0][2] == os.stat(tmp_path / 'src' / 'a.txt').st_mtime_ns / 1e9  # sub-second
  copied = []
  real_copy = storage.copy_file
  monkeypatch.setattr(storage, 'copy_file', lambda s, d: (copied.append(d), real_copy(s, d)))
  storage.copy_tree(str(tmp_path / 'src'), f'{RUN}/copy', last=('b.json',))
  assert copied[-1] == f'{RUN}/copy/sub/b.json' and len(copied) == 3
  assert [(rel, size) for rel, size, _ in storage.walk_files(f'{RUN}/copy')] == [
      ('a.txt', 2), ('sub/b.json', 2), ('sub/c.bin', 3)]
  assert _text(bucket, 'copy/sub/c.bin') == 'ccc'


def test_local_staging_is_the_folder_itself_or_a_temporary_one():
  with storage.local_staging('/some/local/dir') as folder:
    assert folder == '/some/local/dir'
  with storage.local_staging(RUN) as folder:
    assert storage.is_local(folder) and os.path.isdir(folder)
  assert not os.path.exists(folder)  # removed afterwards


def test_a_text_folder_in_the_bucket_is_read_and_fingerprinted(bucket):
  from bipe_jax.data import documents
  from bipe_jax.data import text_folder
  folder = f'{RUN}/texts'
  storage.write_text_atomic(f'{folder}/b.txt', 'Second.\n')
  storage.write_text_atomic(f'{folder}/a.jsonl', '{"text": "One."}\nnot json\n')
  storage.write_text_atomic(f'{folder}/.skip.txt', 'hidden\n')
  report = documents.BuildReport()
  assert list(text_folder.iter_documents(folder, 'text', report)) == [
      ('a.jsonl:1', 'One.'), ('b.txt', 'Second.\n')]
  assert report.bad_json_lines == 1
  before = text_folder.fingerprint(folder, 'text', 0.05)
  assert text_folder.fingerprint(folder, 'text', 0.05) == before
  storage.write_text_atomic(f'{folder}/b.txt', 'Second, longer.\n')
  assert text_folder.fingerprint(folder, 'text', 0.05) != before
  assert not os.path.exists('gs:')
