"""Registry of generated datasets: data made by a task's code, not read from files.

A task (e.g. `bipe_jax.tasks.arithmetic`) registers its hooks under a dataset name when it is
imported; the data layer looks the name up and never imports a task's code by itself. The
project's own tasks are listed by name in `BUILTIN_TASKS` (name -> module): the first lookup of
such a name imports that module, so `import bipe_jax` stays light (no task, no data stack) while
every built-in name is known to any user of the package.

Hooks of a `GeneratedDataset`:
  get_tokenizer(data_config) -> tokenizer (encode, decode, vocab_size, bos_id, eos_id,
                                separator_ids(rule))
  make_train_iterator(data_config, batch_size_per_process, process_index, process_count)
                             -> iterator of {'tokens': int32 [b, seq_len], ...}
  make_eval_blocks(data_config, length, split=, max_tokens=, stride=)
                             -> (tokens [N, length] int32, target_mask [N, length] bool)
  prepare(data_config)       -> None (optional: build whatever the dataset needs)
  file_tokenizer             whether its tokenizer is a SentencePiece file a run pins
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable


@dataclasses.dataclass(frozen=True)
class GeneratedDataset:
  get_tokenizer: Callable
  make_train_iterator: Callable
  make_eval_blocks: Callable
  prepare: Callable | None = None
  # True when the dataset is tokenized with a SentencePiece file (data.tokenizer_path) that a
  # run pins like any text dataset's (bipe_jax.runs.tokenizer); False for a task's own vocabulary.
  file_tokenizer: bool = False


_REGISTRY: dict[str, GeneratedDataset] = {}

# The project's generated datasets: importing the module registers the name.
BUILTIN_TASKS = {
    'arithmetic': 'bipe_jax.tasks.arithmetic',
    'passkey': 'bipe_jax.tasks.passkey',
    'scrolls': 'bipe_jax.tasks.scrolls',
}


def register(name: str, dataset: GeneratedDataset) -> None:
  """Registers `dataset` as `data.dataset=name`; registering a name twice with other hooks is an
  error (two tasks cannot share a name)."""
  if name in _REGISTRY and _REGISTRY[name] != dataset:
    raise ValueError(f'generated dataset {name!r} is already registered')
  _REGISTRY[name] = dataset


def lookup(name: str) -> GeneratedDataset | None:
  """The hooks of a generated dataset, or None for a dataset read from files."""
  if name not in _REGISTRY and name in BUILTIN_TASKS:
    importlib.import_module(BUILTIN_TASKS[name])
  return _REGISTRY.get(name)


def names() -> tuple[str, ...]:
  return tuple(sorted(set(_REGISTRY) | set(BUILTIN_TASKS)))
