"""`train.init_from`'s parameter shapes, compared before a fresh run writes anything.

The source's shapes are read without restoring it: for a bipe_jax workdir, Orbax's array
metadata of the checkpoint `train.init_from` names (its newest step, or DIR@STEP): the `params`
of a training run's `state` item, or the `params` item of a converted folder; for a Hugging
Face folder, the parameters of the model its config.json describes (the tree
`bipe_jax.convert.load_hf` maps the weights into). This run's shapes come from `jax.eval_shape`
of its model's init at [1, data.seq_len] tokens. A source in the other layer layout (scanned or
unrolled, model.scan_layers) is converted abstractly first. The comparison is
`init_from.check_compatible`: the first parameter missing, extra or of another shape, with both
shapes. A vocabulary of another size is such a mismatch (the embedding and the lm head), as it
is when the parameters are loaded: fine-tuning keeps the source's vocabulary.
"""

from __future__ import annotations

import jax
from flax import linen as nn

from bipe_jax import config as model_config_lib
from bipe_jax import model as model_lib
from bipe_jax.runs import restore as runs
from bipe_jax.runs import run_logging
from bipe_jax.state import checkpointing
from bipe_jax.training import init_from


def source_param_shapes(spec: str, length: int) -> dict | None:
  """The parameter tree of the source `spec` names (DIR, DIR@STEP or a Hugging Face folder) as
  jax.ShapeDtypeStruct leaves, nothing restored; `length`: the tokens per row the model of a
  Hugging Face folder is traced at. None when no checkpoint's metadata reads (loading the
  parameters then reports the damage, and falls back as evaluation does)."""
  path, step = runs.parse_source(spec)
  if init_from.is_workdir(path):
    steps = checkpointing.step_dirs(runs.checkpoint_dir(path, runs.read_config(path)))
    for candidate in ([step] if step is not None else sorted(steps, reverse=True)):
      try:
        with run_logging.info_lines_dropped():  # a refused run leaves no library.log
          return checkpointing.saved_param_shapes(steps[candidate])
      except Exception:  # pylint: disable=broad-except  (damaged or missing: see above)
        continue
    return None
  fields, _ = init_from.source_config(path, spec)  # a Hugging Face folder
  try:
    source = _tree_model(fields)
  except ValueError as e:
    raise init_from.InitFromError(f'train.init_from={spec!r}: {e}') from None
  return model_lib.abstract_params(source, length=length)


def _tree_model(fields) -> nn.Module:
  """The Transformer of `config.model` fields, for its parameter tree only: the fields resolved
  later, at training start, do not change the tree (separator ids, from the tokenizer; a RoPE
  scaling's original length, from the data), so they are left out (no scaling)."""
  values = dict(fields.to_dict() if hasattr(fields, 'to_dict') else fields)
  values['rope_scaling'] = 'none'
  return model_lib.Transformer(model_config_lib.model_config_from_dict(
      values, require_separators=False))


def run_param_shapes(config, model: nn.Module | None = None) -> dict:
  """This run's parameter tree (jax.ShapeDtypeStruct leaves) at [1, data.seq_len] tokens:
  `model`'s, or the Transformer of config.model."""
  return model_lib.abstract_params(model or _tree_model(config.model),
                                   length=int(config.data.seq_len))


def check_param_shapes(config, model: nn.Module | None = None) -> None:
  """InitFromError (one line) naming the first parameter of `train.init_from`'s source that is
  missing, extra or of another shape than in this run's model; nothing read but metadata and
  nothing written. No-op without train.init_from."""
  spec = config.train.get('init_from', '')
  if not spec:
    return
  source = source_param_shapes(spec, int(config.data.seq_len))
  if source is None:
    return
  target = run_param_shapes(config, model)
  try:  # scanned <-> unrolled layers
    source = jax.eval_shape(lambda s: model_lib.match_layer_layout(s, target), source)
  except ValueError as e:
    raise init_from.InitFromError(f'train.init_from={spec!r}: the source\'s layers do not fit '
                                  f'this model ({e})') from None
  init_from.check_compatible(source, target)
