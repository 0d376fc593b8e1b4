"""Whether a run can be evaluated on a dataset or probe other than its own (one-line refusals).

A run trained on a task with its own vocabulary (data.dataset='passkey', 'arithmetic': token ids
that are digits and task symbols, no SentencePiece file) reads nothing but that task: scored on
a text corpus it gives a meaningless number (NLL nan on 'embedded'). A task's samples, in turn,
are no text for a run trained on something else (a text run scored on 'passkey': perplexity in
the thousands). Text runs may be scored on any text dataset (they keep their own tokenizer).
"""

from __future__ import annotations


def _task(name: str):
  import bipe_jax.tasks  # pylint: disable=g-import-not-at-top,unused-import  (registers the tasks)
  from bipe_jax.data import generated  # pylint: disable=g-import-not-at-top
  return generated.lookup(name)


def own_vocabulary(dataset: str) -> bool:
  """True for a task tokenised with its own vocabulary (no SentencePiece file)."""
  task = _task(dataset)
  return task is not None and not task.file_tokenizer


def check_dataset(workdir: str, run_dataset: str, dataset: str) -> None:
  """Raises ValueError when the run in `workdir` (trained on `run_dataset`) cannot be scored on
  `dataset` ('' = its own)."""
  if not dataset or dataset == run_dataset:
    return
  if own_vocabulary(run_dataset):
    raise ValueError(f'--dataset={dataset}: workdir {workdir!r} was trained on the '
                     f'{run_dataset!r} task, whose vocabulary is its own; it can be scored on '
                     f"that task only (leave --dataset out)")
  if _task(dataset) is not None:
    raise ValueError(f'--dataset={dataset}: the {dataset!r} task\'s samples fit only a run '
                     f'trained on it; workdir {workdir!r} was trained on data.dataset='
                     f'{run_dataset!r} (leave --dataset out, or name a text dataset)')


def check_passkey_probe(workdir: str, run_dataset: str) -> None:
  """Raises ValueError for a run the passkey probe cannot read: a task run (own vocabulary)
  other than the passkey task itself (which is probed with its own samples)."""
  if run_dataset != 'passkey' and own_vocabulary(run_dataset):
    raise ValueError(f'workdir {workdir!r} was trained on the {run_dataset!r} task, whose '
                     f'vocabulary is its own: the passkey probe is text it cannot read (probe a '
                     f"text run, or a run of data.dataset='passkey')")
