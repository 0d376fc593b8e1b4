"""The tokenizer a run was trained with: copied into the workdir, recorded by content hash.

At training time (`pin_for_training`) the data's tokenizer (`data.tokenizer_path`, or the one
trained beside the dataset) is copied to `<workdir>/tokenizer.model` and the run's config
records `data.tokenizer_path` (that copy) and `data.tokenizer_sha256`. Training, resuming,
evaluation and generation all read that copy, so rebuilding a dataset (even retraining the
tokenizer beside it) never changes the tokens of an existing run, and evaluating on another
dataset (`eval/perplexity.py --dataset/--data_dir`) tokenises it with the run's tokenizer.
A tokenizer whose content differs from the recorded hash is refused with one line
(`TokenizerMismatchError`). Built-in task tokenizers (the arithmetic task) have no file and
are not pinned.
"""

from __future__ import annotations

import os

from bipe_jax import storage

RUN_TOKENIZER_FILE = 'tokenizer.model'


class TokenizerMismatchError(ValueError):
  """A tokenizer other than the one the run was trained with; the message names both files."""


sha256_of = storage.sha256_of  # local or gs:// (etils.epath)


def _has_file_tokenizer(data_config) -> bool:
  from bipe_jax.data import generated  # pylint: disable=g-import-not-at-top
  task = generated.lookup(data_config.dataset)
  return task is None or task.file_tokenizer


def pin_for_training(data_config, workdir: str) -> dict[str, str]:
  """Copies (fresh run) or checks (resume) `<workdir>/tokenizer.model`.

  Returns the data fields that record it, {'tokenizer_path': the copy, 'tokenizer_sha256': its
  hash} ({} for built-in tokenizers), for the run's resolved config (training/resolve.py's
  `tokenizer_pin`); `data_config` is not edited. On resume, an explicit `data.tokenizer_path`
  whose content differs from the run's copy is a TokenizerMismatchError.
  """
  from bipe_jax.data import preparation  # pylint: disable=g-import-not-at-top
  if not _has_file_tokenizer(data_config):
    return {}
  pinned = storage.absolute(os.path.join(workdir, RUN_TOKENIZER_FILE))
  from bipe_jax.data import generated  # pylint: disable=g-import-not-at-top
  task = generated.lookup(data_config.dataset)
  if task is not None:  # a task reading a tokenizer file: its own check (clear errors)
    task.get_tokenizer(data_config)
  source = preparation.tokenizer_path(data_config)
  if storage.isfile(pinned):
    explicit = data_config.tokenizer_path
    if (explicit and storage.absolute(source) != pinned and storage.isfile(source)
        and sha256_of(source) != sha256_of(pinned)):
      raise TokenizerMismatchError(
          f'data.tokenizer_path={explicit!r} is not the tokenizer this run was trained with '
          f'({pinned}, sha256 {sha256_of(pinned)[:12]}…): resume without it, or use a new '
          f'workdir')
  else:
    storage.copy_file(source, pinned)  # processes sharing the workdir copy the same bytes
  return {'tokenizer_path': pinned, 'tokenizer_sha256': sha256_of(pinned)}


def tokenizer_for_run(workdir: str, data_config) -> str | None:
  """The path of a finished run's tokenizer, checked against its recorded hash.

  A workdir copy wins (it moves with the workdir); runs that predate the record fall back to
  the data config's tokenizer. Raises TokenizerMismatchError when the content changed.
  """
  if not _has_file_tokenizer(data_config):
    return None
  from bipe_jax.data import preparation  # pylint: disable=g-import-not-at-top
  pinned = os.path.join(workdir, RUN_TOKENIZER_FILE)
  path = pinned if storage.isfile(pinned) else preparation.tokenizer_path(data_config)
  recorded = data_config.get('tokenizer_sha256', '')
  if recorded and storage.isfile(path) and sha256_of(path) != recorded:
    raise TokenizerMismatchError(
        f'{path} is not the tokenizer run {workdir!r} was trained with: its sha256 is '
        f'{sha256_of(path)[:12]}…, the run recorded {recorded[:12]}… in config.json (was the '
        f'file replaced?)')
  return storage.absolute(path)

