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
for inter-stream rotary its segment count, bipe_jax.runs.position_stats), and everything else
(schedule, data, sequence length, rope scaling, separators, attention implementation) comes
from the new run's config. Model fields that do not change the parameter tree may therefore
differ from the source; a parameter the source lacks, has in excess or has in another shape is
an `InitFromError` naming it. A run that already has checkpoints resumes from them and ignores
`train.init_from`.

Before a fresh run writes anything, `check_source` checks the path (it holds a run, and the step
named) and that the position streams stay those the source was trained with: the same
`model.position_encoding` and, for bipe_*, the same separators rule. Changing either is a
deliberate choice: `train.init_from_allow_encoding_change=True`. Then
`init_from_shapes.check_param_shapes` compares the source's parameter shapes (read from its
checkpoint's metadata, nothing restored) with this run's model, also before anything is written.
"""

from __future__ import annotations

import os
from typing import Sequence

import jax
import numpy as np

from bipe_jax import model as model_lib
from bipe_jax import schemes
from bipe_jax.runs import restore as runs
from bipe_jax import storage
from bipe_jax.state import checkpointing


class InitFromError(ValueError):
  """train.init_from cannot be used: the message names the path or the parameter."""


def is_workdir(path: str) -> bool:
  """Whether `path` is a bipe_jax workdir (config.json and its checkpoint folder), not a
  Hugging Face folder."""
  if not storage.isfile(os.path.join(path, 'config.json')):
    return False
  try:
    return storage.isdir(runs.checkpoint_dir(path, runs.read_config(path)))
  except Exception:  # pylint: disable=broad-except  (an HF config.json is not ours)
    return False


def load_source_params(spec: str, *, separator_ids: Sequence[int] = ()) -> tuple[dict, str]:
  """(parameters as a tree of NumPy arrays, a one-line description of the source).

  separator_ids: used only to build the model of a Hugging Face folder (the parameter tree does
  not depend on them); the new run's resolved ids.
  """
  path, step = runs.parse_source(spec)
  if not storage.isdir(path):
    raise InitFromError(f'train.init_from={spec!r}: {path} is not a directory')
  if is_workdir(path):
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
  path, _ = runs.parse_source(spec)
  if not is_workdir(path):
    return None
  return int(runs.read_config(path).data.seq_len)


ALLOW_FIELD = 'train.init_from_allow_encoding_change'


def stream_mismatch(source_model, source_data, model, data) -> str | None:
  """What differs between the position streams of a source and of a run fine-tuned from it
  (the encoding; for bipe_* the separators that cut segments), or None when they match.

  source_data: the source's data section (None for a Hugging Face folder, whose separators
  are ids)."""
  have, want = source_model['position_encoding'], model['position_encoding']
  if have != want:
    return (f'the source was trained with model.position_encoding={have!r}, this run uses '
            f'{want!r}')
  if not schemes.get_scheme(want).bilevel:
    return None
  from bipe_jax.data import preparation  # pylint: disable=g-import-not-at-top
  rule_have = preparation.separator_rule(source_model, source_data)
  rule_want = preparation.separator_rule(model, data)
  ids_have = tuple(int(i) for i in source_model.get('separator_ids', ()))
  ids_want = tuple(int(i) for i in model.get('separator_ids', ()))
  if 'ids' in (rule_have, rule_want) or rule_have == rule_want:
    if rule_want == 'ids' and ids_have and set(ids_have) != set(ids_want):
      return (f'the source cut segments at separator ids {ids_have}, this run at {ids_want} '
              f'(model.separator_ids)')
    return None
  return (f'the source cut segments with model.separators={rule_have!r}, this run with '
          f'{rule_want!r}')


def source_config(path: str, spec: str):
  """(model fields, data section or None) of the source at `path`; InitFromError when it is
  neither a bipe_jax run with a checkpoint nor a Hugging Face folder."""
  if is_workdir(path):
    config = runs.read_config(path)
    return config.model, config.data
  try:
    hf = storage.read_json(os.path.join(path, 'config.json'))
  except (OSError, ValueError):
    hf = None
  if not isinstance(hf, dict) or 'hidden_size' not in hf:
    raise InitFromError(f'train.init_from={spec!r}: {path} holds no run: neither a bipe_jax '
                        f'workdir (config.json and checkpoints/) nor a Hugging Face folder '
                        f'(config.json with hidden_size)')
  from bipe_jax.interop import hf_llama  # pylint: disable=g-import-not-at-top
  try:
    fields = hf_llama.model_fields_from_hf_config(hf)
    fields['separators'] = hf.get(hf_llama.SEPARATOR_RULE_KEY, 'ids')  # exported by bipe_jax
    return fields, None
  except ValueError as e:
    raise InitFromError(f'train.init_from={spec!r}: {e}') from None


def check_source(config) -> None:
  """Checks `train.init_from` before a run writes anything: the path exists and holds a run
  (and the checkpoint step named with @STEP); its position streams match this run's (see
  `stream_mismatch`) unless `train.init_from_allow_encoding_change` is set. InitFromError (one
  line) otherwise. Call it only for a fresh run (a run with checkpoints ignores init_from)."""
  spec = config.train.get('init_from', '')
  if not spec:
    return
  path, step = runs.parse_source(spec)
  if not storage.isdir(path):  # a local folder or gs://...
    what = 'is a file' if storage.exists(path) else 'does not exist'
    raise InitFromError(f'train.init_from={spec!r}: {path} {what} (give a training workdir, '
                        f'WORKDIR@STEP, or a Hugging Face folder)')
  source_model, source_data = source_config(path, spec)
  if step is not None:
    if source_data is None:
      raise InitFromError(f'train.init_from={spec!r}: a step (@{step}) needs a bipe_jax '
                          f'workdir, and {path} is a Hugging Face folder')
    ckpt_dir = runs.checkpoint_dir(path, runs.read_config(path))
    steps = sorted(checkpointing.step_dirs(ckpt_dir))
    if step not in steps:
      raise InitFromError(f'train.init_from={spec!r}: checkpoint step {step} is not in '
                          f'{ckpt_dir}; available steps: {steps}')
  if config.train.get(ALLOW_FIELD.split('.')[1], False):
    return
  mismatch = stream_mismatch(source_model, source_data, config.model, config.data)
  if mismatch:
    raise InitFromError(f'train.init_from={spec!r}: {mismatch}. Fine-tuning keeps the position '
                        f'streams: set the same value, or --config.{ALLOW_FIELD}=true to change '
                        f'them deliberately')


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
  source, description = load_source_params(spec, separator_ids=separator_ids)
  source = model_lib.match_layer_layout(source, state.params)  # scanned <-> unrolled layers
  check_compatible(source, state.params)
  params = jax.device_put(
      jax.tree.map(lambda s, t: np.asarray(s, dtype=t.dtype), source, state.params),
      params_shardings)
  return state.replace(params=params), description
