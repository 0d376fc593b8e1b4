"""Two jobs sharing a data_dir prepare it once: `prepare` holds a lock on the data_dir.

Without it two training runs started together both built the text folder, and the second
rename of TFDS's incomplete.* directory failed (seen in the suite's own e2e tests).
"""

import os
import threading

from bipe_jax.data import preparation
from bipe_jax.data import tfds_builders
from tests.data.test_data_builders import folder_config
from tests.data.test_data_builders import write_corpus


def small_config(tmp_path):
  write_corpus(tmp_path / 'text')
  return folder_config(tmp_path / 'text', tmp_path / 'data', tokenizer_vocab_size=320)


def preparing_thread(config, results: list, errors: list) -> threading.Thread:
  """A thread that calls prepare(config) and appends its result (or its exception)."""

  def prepare():
    try:
      results.append(preparation.prepare(config))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  return threading.Thread(target=prepare)


def test_a_preparation_waits_for_the_lock_and_then_builds(tmp_path):
  config = small_config(tmp_path)
  results, errors = [], []
  waiting = preparing_thread(config, results, errors)
  with preparation.preparation_lock(config):
    waiting.start()
    waiting.join(timeout=3.0)
    assert waiting.is_alive(), 'prepare() ran while another holder had the lock'
    assert tfds_builders._prepared_version_dir(tfds_builders.dataset_root(config)) is None  # pylint: disable=protected-access
  waiting.join(timeout=120)
  assert not waiting.is_alive() and not errors, errors
  (prepared,) = results
  assert prepared.built and prepared.trained_tokenizer
  assert os.path.isfile(prepared.tokenizer_path)


def test_two_concurrent_preparations_build_once_and_both_succeed(tmp_path):
  config = small_config(tmp_path)
  results, errors = [], []
  threads = [preparing_thread(config, results, errors) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not errors, errors
  assert sorted(p.built for p in results) == [False, True]
  assert sorted(p.trained_tokenizer for p in results) == [False, True]
  assert results[0].version_dir == results[1].version_dir
  assert results[0].tokenizer_path == results[1].tokenizer_path


def test_a_read_only_data_dir_is_prepared_without_the_lock(tmp_path):
  config = small_config(tmp_path)
  preparation.prepare(config)
  os.chmod(tmp_path / 'data', 0o555)
  try:
    if os.access(tmp_path / 'data', os.W_OK):  # root ignores the mode: take the lock file away
      os.chmod(tmp_path / 'data', 0o755)
      os.remove(tmp_path / 'data' / preparation.LOCK_FILE)
      os.mkdir(tmp_path / 'data' / preparation.LOCK_FILE)  # cannot be opened for appending
    again = preparation.prepare(config)
  finally:
    os.chmod(tmp_path / 'data', 0o755)
  assert not again.built and not again.trained_tokenizer
