"""What a workdir records about its run (`config.json`), and the check that a resume matches it.

`config.json` is the fully resolved config of the run (separator ids resolved from the
tokenizer, the tokenizer's path and sha256). It is written only once the train state exists —
after a successful restore or a fresh initialisation — so a restore that fails never replaces
the record of what was trained.

Resuming compares the `model` and `data` sections of the new config with the saved ones: a
resume with another encoding, another `rope_base`, other separators, another dataset or another
tokenizer is refused with the list of differing fields. The fields that may change on resume are
named here, in `RESUMABLE_FIELDS`, and nowhere else (the `train`, `checkpoint` and `mesh`
sections are not compared: a changed optimizer setting that alters the optimizer state is caught
by the checkpoint's structure check, and steps, logging, evaluation cadence, checkpoint cadence
and the mesh may change freely).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from bipe_jax import storage

CONFIG_FILE = 'config.json'
COMPARED_SECTIONS = ('model', 'data')
# Fields of the compared sections that may differ on resume: they change neither the
# parameters, nor the data a step sees, nor the numbers (up to float rounding).
RESUMABLE_FIELDS = frozenset({
    'model.attention_impl',  # dense | blockwise | cudnn | fused | pallas: the same attention
    'model.block_size',  # blockwise attention's tiling
    'model.remat',  # recompute activations instead of storing them
    'model.kernels',  # portable | cpu compute forms (bipe_jax.kernels): same numbers
    'data.num_threads',  # tokenisation threads
    'data.prefetch',  # batches prefetched
    'data.tokenizer_path',  # the workdir's copy moves with it; data.tokenizer_sha256 compares
})


class ResumeMismatchError(ValueError):
  """The workdir holds another run: the message lists the fields that differ."""


def _plain(value: Any) -> Any:
  """JSON's view of a value (tuples become lists), so saved and live configs compare equal."""
  return json.loads(json.dumps(value, default=str))


read_json = storage.read_json  # local or gs:// (etils.epath), see bipe_jax/storage.py
write_text_atomic = storage.write_text_atomic


# What a damaged config.json's one line suggests: never to delete it (a resume needs it).
CONFIG_REMEDY = ('restore it from a copy (it records the settings the checkpoints were trained '
                 'with), or train in a new workdir')


class MissingConfigError(ResumeMismatchError):
  """Checkpoints without the config.json that records what they were trained with."""


def read_saved_config(workdir: str) -> dict | None:
  return read_json(os.path.join(workdir, CONFIG_FILE), remedy=CONFIG_REMEDY)


# Fields that hold a local path: config.json records them absolute (a run read from another
# directory finds its data), and the resume check compares them absolute.
PATH_FIELDS = ('data.data_dir', 'data.text_dir', 'data.pile_dir', 'data.tokenizer_path', 'data.scrolls_jsonl',
               'checkpoint.dir', 'train.init_from')


def absolute_path(value: str) -> str:
  """`value` made absolute against the current directory ('' and URLs such as gs://... kept;
  a train.init_from 'DIR@STEP' keeps its @STEP)."""
  if not isinstance(value, str) or not value or '://' in value:
    return value
  match = re.fullmatch(r'(.+)(@\d+)', value)
  path, step = (match.group(1), match.group(2)) if match else (value, '')
  return storage.absolute(path) + step


def _with_absolute_paths(section: str, fields: dict) -> dict:
  return {k: absolute_path(v) if f'{section}.{k}' in PATH_FIELDS else v
          for k, v in fields.items()}


def differing_fields(saved: dict, config) -> list[str]:
  """['model.position_encoding: saved 'bipe_rope', now 'bipe_alibi'', ...] (resumable fields and
  fields the saved config does not record are skipped)."""
  out = []
  for section in COMPARED_SECTIONS:
    old = _with_absolute_paths(section, saved.get(section) or {})
    new = _with_absolute_paths(section, _plain(config[section].to_dict()
                                               if hasattr(config[section], 'to_dict')
                                               else dict(config[section])))
    for field in sorted(set(old) | set(new)):
      name = f'{section}.{field}'
      if name in RESUMABLE_FIELDS or field not in old:
        continue
      if old.get(field) != new.get(field):
        out.append(f'{name}: saved {old.get(field)!r}, now {new.get(field)!r}')
  return out


def check_resume(workdir: str, config, checkpoint_steps=()) -> None:
  """Raises ResumeMismatchError when `workdir` holds a run whose model/data config differs, or
  (MissingConfigError) when it holds checkpoints (`checkpoint_steps`) but no config.json: what
  they were trained with is then unknown, so nothing could be checked."""
  saved = read_saved_config(workdir)
  if saved is None:
    if checkpoint_steps:
      steps = sorted(checkpoint_steps)
      raise MissingConfigError(
          f'{workdir} holds checkpoints (steps {steps}) but no {CONFIG_FILE}, which records the '
          'settings they were trained with: a resume cannot be checked, so it does not start; '
          f'restore {CONFIG_FILE} from a copy, or train in a new workdir')
    return
  diffs = differing_fields(saved, config)
  if diffs:
    raise ResumeMismatchError(
        f'{os.path.join(workdir, CONFIG_FILE)} records another run ({len(diffs)} differing '
        f'field{"s" if len(diffs) > 1 else ""}: {"; ".join(diffs)}); resume with the settings it '
        f'was trained with, or use a new workdir')


def write_config(workdir: str, config) -> str:
  """Writes the resolved config as `<workdir>/config.json` (atomically), its `PATH_FIELDS`
  absolute; returns the path."""
  path = os.path.join(workdir, CONFIG_FILE)
  record = json.loads(config.to_json_best_effort() if hasattr(config, 'to_json_best_effort')
                      else json.dumps(dict(config), default=str))
  for name in PATH_FIELDS:
    section, field = name.split('.')
    if field in (record.get(section) or {}):
      record[section][field] = absolute_path(record[section][field])
  return write_text_atomic(path, json.dumps(record, indent=2))
