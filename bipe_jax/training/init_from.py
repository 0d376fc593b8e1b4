"""Fine-tuning from a trained model: `train.init_from` gives the parameters of step 0.

`train.init_from` is one of
  DIR        a bipe_jax workdir (a training run, or a folder written by `bipe_jax.convert`):
             its newest checkpoint that restores;
  DIR@STEP   the same at checkpoint STEP;
  HF_DIR     a Hugging Face Llama / released-BiPE folder (config.json + safetensors or
             pytorch_model.bin), mapped by bipe_jax.interop in memory.
The source may have scanned or unrolled layers (`model.scan_layers`): the parameters are
converted to this run's layout. Only the parameters are taken: the optimizer state is fresh,
the step is 0 (a RoPE scaling's original length, when not set, is the source's data.seq_len;
for inter-stream rotary its segment count, bipe_jax.training.position_stats), and everything else
(schedule, data, sequence length, rope scaling, separators, attention implementation) comes
from the new run's config. Model fields that do not change the parameter tree may therefore
differ from the source; a parameter the source lacks, has in excess or has in another shape is
an `InitFromError` naming it. A run that already has checkpoints resumes from them and ignores
`train.init_from`.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

import jax
import numpy as np

from bipe_jax import workdir_io


class InitFromError(ValueError):
  """train.init_from cannot be used: the message names the path or the parameter."""


def parse_source(spec: str) -> tuple[str, int | None]:
  """'DIR' -> (DIR, None); 'DIR@123' -> (DIR, 123)."""
  match = re.fullmatch(r'(.+)@(\d+)', spec)
  path, step = (match.group(1), int(match.group(2))) if match else (spec, None)
  return workdir_io.absolute(path), step


def _is_workdir(path: str) -> bool:
  from bipe_jax import run_restore as runs  # pylint: disable=g-import-not-at-top
  if not workdir_io.isfile(os.path.join(path, 'config.json')):
    return False
  try:
    return workdir_io.isdir(runs.checkpoint_dir(path, runs.read_config(path)))
  except Exception:  # pylint: disable=broad-except  (an HF config.json is not ours)
    return False


def load_source_params(spec: str, *, separator_ids: Sequence[int] = ()) -> tuple[dict, str]:
  """(parameters as a tree of NumPy arrays, a one-line description of the source).

  separator_ids: used only to build the model of a Hugging Face folder (the parameter tree does
  not depend on them); the new run's resolved ids.
  """
  path, step = parse_source(spec)
  if not workdir_io.isdir(path):
    raise InitFromError(f'train.init_from={spec!r}: {path} is not a directory')
  if _is_workdir(path):
    from bipe_jax import run_restore as runs  # pylint: disable=g-import-not-at-top
    try:
      run = runs.load_run(path, step=step, attention_impl='dense')
    except runs.RunError as e:
      raise InitFromError(f'train.init_from={spec!r}: {e}') from None
    params = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), run.params)
    return params, f'{path} (checkpoint step {run.step}, {run.encoding})'
  if step is not None:
    raise InitFromError(f'train.init_from={spec!r}: a step (@{step}) needs a bipe_jax workdir, '
                        f'and {path} has no config.json with checkpoints')
  from bipe_jax.interop import convert  # pylint: disable=g-import-not-at-top
  try:
    _, params = convert.load_hf(path, separator_ids=tuple(separator_ids) or (0,))
  except (ValueError, OSError, KeyError) as e:
    raise InitFromError(f'train.init_from={spec!r}: neither a bipe_jax workdir nor a readable '
                        f'Hugging Face folder ({str(e).splitlines()[0][:200]})') from None
  return params, f'{path} (Hugging Face folder)'


def source_seq_len(spec: str) -> int | None:
  """data.seq_len of the workdir `spec` names (None: no spec, or not a bipe_jax workdir)."""
  if not spec:
    return None
  path, _ = parse_source(spec)
  if not _is_workdir(path):
    return None
  from bipe_jax import run_restore as runs  # pylint: disable=g-import-not-at-top
  return int(runs.read_config(path).data.seq_len)


def check_compatible(source_params, target_params) -> None:
  """Raises InitFromError naming the first parameter missing, extra or of another shape."""
  flat = lambda tree: {jax.tree_util.keystr(p): tuple(np.shape(x))
                       for p, x in jax.tree_util.tree_leaves_with_path(tree)}
  have, want = flat(source_params), flat(target_params)
  missing = sorted(set(want) - set(have))
  extra = sorted(set(have) - set(want))
  if missing:
    raise InitFromError(f'train.init_from: the source has no parameter {missing[0]} (shape '
                        f'{want[missing[0]]}) that this model needs'
                        + (f' ({len(missing)} missing in all)' if len(missing) > 1 else ''))
  if extra:
    raise InitFromError(f'train.init_from: the source has parameter {extra[0]} (shape '
                        f'{have[extra[0]]}) that this model does not have'
                        + (f' ({len(extra)} extra in all)' if len(extra) > 1 else ''))
  for name in sorted(want):
    if have[name] != want[name]:
      raise InitFromError(f'train.init_from: parameter {name} has shape {have[name]} in the '
                          f'source, {want[name]} in this model')


def with_source_params(state, spec: str, params_shardings, *, separator_ids=()):
  """(`state` with its parameters replaced by the source's, description); optimizer state, step
  and rng of `state` unchanged (a fresh run's)."""
  from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  source, description = load_source_params(spec, separator_ids=separator_ids)
  source = model_lib.match_layer_layout(source, state.params)  # scanned <-> unrolled layers
  check_compatible(source, state.params)
  params = jax.device_put(
      jax.tree.map(lambda s, t: np.asarray(s, dtype=t.dtype), source, state.params),
      params_shardings)
  return state.replace(params=params), description
