"""Restoring a trained run from its workdir: for evaluation, generation, `train.init_from` and
conversion (below training and evaluation, so neither imports the other).

A training workdir (train/main.py) holds the config the run used and Orbax checkpoints of the
train state (bipe_jax/state/checkpointing.py). `load_run` reads the config, rebuilds the
model with evaluation overrides (blockwise attention, so memory grows linearly with length),
lays the parameters out on a mesh of this machine's devices, and restores the latest (or a
named) checkpoint, falling back past one that cannot be read, with a warning. It never
modifies the workdir.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import sys
from typing import Any, Callable

import jax
import ml_collections

from bipe_jax import config as model_config_lib
from bipe_jax import platform_choices
from bipe_jax import restore_messages
from bipe_jax.runs import run_record
from bipe_jax.runs import tokenizer as run_tokenizer
from bipe_jax import storage
from bipe_jax import storage_faults
from bipe_jax import model as model_lib
from bipe_jax.state import checkpointing
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import train_state as train_state_lib

CONFIG_FILES = ('config.json',)
# Evaluation's attention: every scheme, memory linear in the length (whatever the run trained with).
EVAL_ATTENTION_IMPL = 'blockwise'


class RunError(ValueError):
  """A workdir that cannot be evaluated: missing, empty, no config or no checkpoint."""


@dataclasses.dataclass
class Run:
  workdir: str
  config: ml_collections.ConfigDict  # as trained (model.separator_ids resolved)
  model_config: model_config_lib.ModelConfig  # with the evaluation overrides
  model: model_lib.Transformer
  params: Any
  step: int
  mesh: jax.sharding.Mesh

  @property
  def encoding(self) -> str:
    return self.model_config.position_encoding

  @property
  def train_length(self) -> int:
    return int(self.config.data.seq_len)

  def apply_fn(self) -> Callable:
    """(params, tokens [B, L]) -> logits [B, L, V] of the evaluation model."""
    model = self.model
    return lambda params, tokens: model.apply({'params': params}, tokens)

  def context(self):
    """The mesh + logical-axis rules to trace the model under."""
    return train_state_lib.mesh_context(self.mesh)


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a training run saved in `workdir`; RunError naming what is missing."""
  if not workdir:
    raise RunError('--workdir is empty: give the directory of a training run')
  storage_faults.check_reachable(workdir)  # a bucket that does not answer is not "no workdir"
  if not storage.isdir(workdir):
    raise RunError(f'workdir {workdir!r} does not exist (train first: python train/main.py '
                   f'--config=configs/tiny.py --workdir={workdir})')
  if not storage.listdir(workdir):
    raise RunError(f'workdir {workdir!r} is empty: no saved config and no checkpoint (train '
                   f'first: python train/main.py --config=configs/tiny.py --workdir={workdir})')
  for name in CONFIG_FILES:
    saved = storage.read_json(os.path.join(workdir, name), remedy=run_record.CONFIG_REMEDY)
    if saved is not None:
      return ml_collections.ConfigDict(saved)
  raise RunError(f'workdir {workdir!r} has no saved config ({" or ".join(CONFIG_FILES)}): is it '
                 'a training workdir of train/main.py?')


def parse_source(spec: str) -> tuple[str, int | None]:
  """'DIR' -> (DIR, None); 'DIR@123' -> (DIR, 123)."""
  match = re.fullmatch(r'(.+)@(\d+)', spec)
  path, step = (match.group(1), int(match.group(2))) if match else (spec, None)
  return storage.absolute(path), step


def checkpoint_dir(workdir: str, config) -> str:
  configured = config.checkpoint.get('dir', '') if 'checkpoint' in config else ''
  return configured or os.path.join(workdir, 'checkpoints')


def _eval_mesh(config) -> jax.sharding.Mesh:
  """The run's mesh when it fits this machine's devices, else data parallel over all."""
  try:
    return mesh_lib.make_mesh(config.mesh)
  except (ValueError, AttributeError):
    return mesh_lib.make_mesh(ml_collections.ConfigDict({'data': -1, 'fsdp': 1, 'tensor': 1}))


def _model_config(config, overrides: dict) -> model_config_lib.ModelConfig:
  values = config.model.to_dict()
  values.update(overrides)
  return model_config_lib.model_config_from_dict(values)


def load_run(workdir: str, *, step: int | None = None, attention_impl: str = EVAL_ATTENTION_IMPL,
             block_size: int | None = None, mesh: jax.sharding.Mesh | None = None) -> Run:
  """Config, evaluation model and restored params of a training workdir.

  step: a checkpoint step (None = the newest that restores). attention_impl / block_size
  override the model's for evaluation (the parameters do not depend on them).
  """
  config = read_config(workdir)
  try:  # the run's own tokenizer (its workdir copy), checked against the recorded hash
    pinned = run_tokenizer.tokenizer_for_run(workdir, config.data)
  except run_tokenizer.TokenizerMismatchError as e:
    raise RunError(str(e)) from None
  if pinned:
    config.data.tokenizer_path = pinned
  ckpt_dir = checkpoint_dir(workdir, config)
  steps = _steps(ckpt_dir)
  if not steps:
    raise RunError(f'workdir {workdir!r} has no checkpoint in {ckpt_dir} (is the training run '
                   'finished, or at least past checkpoint.every_steps?)')
  if step is not None and step not in steps:
    raise RunError(f'checkpoint step {step} is not in {ckpt_dir}; available steps: {steps}')
  overrides = {'attention_impl': attention_impl}
  if block_size:
    overrides['block_size'] = int(block_size)
  try:  # the separators resolved at training start, as stored in config.json: never re-resolved
    model_config = _model_config(config, overrides)
  except ValueError as e:
    raise RunError(f'{os.path.join(workdir, "config.json")}: {e}') from None
  mesh = mesh or _eval_mesh(config)
  model_config = platform_choices.config_for_mesh(model_config, mesh)  # 'auto': the mesh's platform
  model = model_lib.Transformer(model_config)
  # The parameter tree does not depend on the attention path, so the evaluation model gives
  # the parameters' shapes (and a run trained with attention_impl='cudnn' loads on CPU). Only
  # the parameters are restored: no optimizer state is built.
  abstract, shardings = train_state_lib.param_shardings(model, mesh, int(config.data.seq_len))
  target = train_state_lib.abstract_with_shardings(abstract, shardings)
  ckpt = checkpointing.Checkpointer(ckpt_dir, every_steps=1, keep=10**9, async_save=False)
  try:
    candidates = [step] if step is not None else list(reversed(steps))
    errors = []
    for s in candidates:
      try:
        with restore_messages.quiet_failed_reads():
          params = ckpt.restore_trained_params(s, target)
        if errors:
          print(restore_messages.used_line(s), file=sys.stderr, flush=True)
          gc.collect()  # the failed restore's abandoned reads go now, under the filter, not at exit
        return Run(workdir=workdir, config=config, model_config=model_config, model=model,
                   params=params, step=int(s), mesh=mesh)
      except Exception as e:  # pylint: disable=broad-except
        restore_messages.install_unraisable_filter()
        errors.append(f'step {s}: {restore_messages.short_reason(e)}')
        print(restore_messages.damaged_line(s, ckpt_dir, e, 'trying the previous one'),
              file=sys.stderr, flush=True)
    raise RunError(f'no checkpoint of {ckpt_dir} could be restored: {"; ".join(errors)}')
  finally:
    ckpt.close()


def _steps(ckpt_dir: str) -> list[int]:
  """Complete checkpoint steps (Orbax step directories named by their number)."""
  return sorted(checkpointing.step_dirs(ckpt_dir))


def labels_for(runs: list[Run]) -> list[str]:
  """Encoding names; the workdir's basename is appended where two runs share an encoding."""
  names = [r.encoding for r in runs]
  return [n if names.count(n) == 1 else f'{n} ({os.path.basename(os.path.normpath(r.workdir))})'
          for n, r in zip(names, runs)]
