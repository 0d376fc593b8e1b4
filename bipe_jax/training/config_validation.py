"""Validate the whole config once at start, with one clear line per problem.

`validate_config` checks the train / checkpoint / mesh sections against the devices and
processes of this run and delegates the model section to `bipe_jax.config` (the model's own
validation). `resolve_model_config` then fills `model.separator_ids` from the tokenizer
(model.separators 'auto' | 'sentence' | 'newline' | 'official' | 'ids') and checks the vocab
sizes and the BOS / EOS ids agree with the tokenizer.
Every error is a `ConfigError` (a ValueError) whose message names the field, its value and
what is allowed.
"""

import difflib
import math

from bipe_jax import config as model_config_lib
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer as optimizer_lib


class ConfigError(ValueError):
  """A config value that cannot work; the message is one line naming field and allowed values."""


def _require(ok: bool, field: str, value, allowed: str):
  if not ok:
    raise ConfigError(f'{field}={value!r} is invalid: {allowed}')


def _num(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate_train(t) -> None:
  """Checks config.train (no device information needed)."""
  for name, minimum in (('steps', 1), ('batch_size', 1), ('warmup_steps', 0),
                        ('grad_accum_steps', 1), ('log_every', 1), ('seed', 0),
                        ('data_shards', 0), ('eval_every', 0), ('eval_tokens', 1),
                        ('loss_chunk_tokens', 0)):
    value = t[name]
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
             f'train.{name}', value, f'must be an integer >= {minimum}')
  lr = t.learning_rate
  _require(_num(lr) and lr >= 0, 'train.learning_rate', lr, 'must be a finite number >= 0')
  _require(t.schedule in optimizer_lib.SCHEDULES, 'train.schedule', t.schedule,
           f'must be one of {optimizer_lib.SCHEDULES}')
  ratio = t.end_learning_rate_ratio
  _require(_num(ratio) and 0 <= ratio <= 1, 'train.end_learning_rate_ratio', ratio,
           'must be in [0, 1]')
  _require(_num(t.weight_decay) and t.weight_decay >= 0, 'train.weight_decay', t.weight_decay,
           'must be >= 0')
  for name in ('b1', 'b2'):
    _require(_num(t[name]) and 0 <= t[name] < 1, f'train.{name}', t[name], 'must be in [0, 1)')
  _require(_num(t.eps) and t.eps > 0, 'train.eps', t.eps, 'must be > 0')
  _require(_num(t.grad_clip) and t.grad_clip >= 0, 'train.grad_clip', t.grad_clip,
           'must be >= 0 (0 = no clipping)')
  _require(_num(t.peak_flops_per_device) and t.peak_flops_per_device >= 0,
           'train.peak_flops_per_device', t.peak_flops_per_device,
           'must be >= 0 (FLOP/s; 0 = the device kind\'s published peak)')


def validate_checkpoint(c) -> None:
  for name in ('every_steps', 'keep'):
    value = c[name]
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
             f'checkpoint.{name}', value, 'must be an integer >= 1')
  _require(isinstance(c.async_save, bool), 'checkpoint.async_save', c.async_save,
           'must be True or False')


def validate_mesh(config, device_count: int) -> tuple[int, ...]:
  """Checks the mesh against the device count and the global batch against the batch shards.

  Returns the resolved mesh shape (data, fsdp, context, tensor).
  """
  m = config.mesh
  for name in mesh_lib.MESH_AXES:
    value = m.get(name, 1)
    _require(isinstance(value, int) and not isinstance(value, bool) and (value >= 1 or value == -1),
             f'mesh.{name}', value, 'must be a positive integer or -1 (fill with the rest)')
  try:
    shape = mesh_lib.resolve_mesh_shape(mesh_lib.mesh_sizes(m), device_count)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  t = config.train
  shards = shape[0] * shape[1]
  accum = t.grad_accum_steps
  _require(t.batch_size % (shards * accum) == 0, 'train.batch_size', t.batch_size,
           f'must be a multiple of the batch shards mesh.data*mesh.fsdp={shards} times '
           f'train.grad_accum_steps={accum} (= {shards * accum})')
  context = shape[mesh_lib.MESH_AXES.index(mesh_lib.CONTEXT_AXIS)]
  seq_len = config.data.seq_len
  _require(isinstance(seq_len, int) and seq_len % context == 0, 'data.seq_len', seq_len,
           f'must be a multiple of mesh.context={context} (each context shard holds '
           f'seq_len / context tokens)')
  return shape


def validate_data_shards(config, data_process_count: int) -> int:
  """Checks train.data_shards against the data-loading processes; returns the shard count."""
  t = config.train
  data_shards = t.data_shards or data_process_count
  _require(data_shards % data_process_count == 0, 'train.data_shards', t.data_shards,
           f'must be a multiple of the {data_process_count} data-loading processes (or 0)')
  _require(t.batch_size % data_shards == 0, 'train.batch_size', t.batch_size,
           f'must be a multiple of the logical data shards train.data_shards={data_shards}')
  return data_shards


# Model fields derived from another field unless set explicitly (> 0): (field, source, why).
DERIVED_MODEL_FIELDS = (
    ('train_length', 'data.seq_len', "FIRE's L0 and RoPE log-scale reference"),
    ('rope_original_length', 'data.seq_len', 'the original length of a RoPE scaling method '
     "(fine-tuning with train.init_from: the source run's data.seq_len)"),
)


def validate_derivation_inputs(config) -> None:
  """Checks what `derive_fields` reads (the encoding's name, the source fields), so an error
  names the field the user set, not one derived from it."""
  from bipe_jax import schemes  # pylint: disable=g-import-not-at-top
  name = config.model.position_encoding
  if name not in schemes.SCHEMES:
    close = difflib.get_close_matches(str(name), schemes.SCHEME_NAMES, n=1)
    hint = f'did you mean {close[0]!r}? ' if close else ''
    raise ConfigError(f'model.position_encoding={name!r} is invalid: {hint}must be one of '
                      f'{", ".join(schemes.SCHEME_NAMES)}')
  for _, source, _ in DERIVED_MODEL_FIELDS:
    section, field = source.split('.')
    value = config[section][field]
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 2, source,
             value, 'must be an integer >= 2')


def derive_fields(config) -> None:
  """Fills model fields left at 0 from their source (`DERIVED_MODEL_FIELDS`), in place, so the
  run records the values it used; explicitly set values are kept."""
  from bipe_jax.training import init_from  # pylint: disable=g-import-not-at-top
  from bipe_jax.runs import position_stats  # pylint: disable=g-import-not-at-top
  validate_derivation_inputs(config)
  for field, source, _ in DERIVED_MODEL_FIELDS:
    if field == 'rope_original_length' and position_stats.needs_inter_original_length(
        config.model):
      continue  # in segments, from the data: position_stats.resolve_inter_original_length
    if config.model.get(field, 0) == 0:
      section, name = source.split('.')
      value = int(config[section][name])
      if field == 'rope_original_length':  # a fine-tune extends its source's training length
        value = init_from.source_seq_len(config.train.init_from) or value
      with config.unlocked() if hasattr(config, 'unlocked') else _null():
        config.model[field] = value


def validate_config(config, device_count: int) -> None:
  """Validates every section once at start. Raises ConfigError (one line)."""
  for name in ('model', 'data', 'train', 'checkpoint', 'mesh'):
    if name not in config:
      raise ConfigError(f'config has no section {name!r}; build configs from configs/base.py')
  if config.model.separators == 'official' and not config.data.get('tokenizer_path'):
    raise ConfigError("model.separators='official' means ids (869, 13) of the Llama tokenizer: "
                      'set data.tokenizer_path to its tokenizer.model (never downloaded), or '
                      "use a rule (model.separators='auto') with the data's own tokenizer")
  try:  # separator ids of a rule are resolved from the tokenizer later (resolve_model_config)
    model_config_lib.model_config_from_dict(config.model,
                                            require_separators=config.model.separators == 'ids',
                                            inter_length_later=True)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  seq_len = config.data.seq_len
  _require(isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len >= 2,
           'data.seq_len', seq_len, 'must be an integer >= 2')
  validate_train(config.train)
  validate_checkpoint(config.checkpoint)
  validate_mesh(config, device_count)


def resolve_model_config(config, tokenizer) -> model_config_lib.ModelConfig:
  """The ModelConfig with separator ids resolved from the tokenizer; checks the vocab size.

  model.separators: 'auto' (the dataset's default rule: 'newline' for code folders, else
  'sentence'), 'sentence', 'newline' or 'official' ({869, 13}, checked against the tokenizer's
  pieces) fill model.separator_ids (also written back into `config.model`, so the run records
  them); 'ids' keeps the given ids. A bipe_* scheme whose resolved set is empty is an error.
  """
  vocab = tokenizer.vocab_size
  for field in ('bos_id', 'eos_id'):
    want = int(getattr(tokenizer, field))
    if int(config.model[field]) != want:
      raise ConfigError(f'model.{field}={config.model[field]} does not match the tokenizer '
                        f'{getattr(tokenizer, "path", "")} ({field} {want}): set '
                        f'model.{field}={want}')
  if config.model.vocab_size != vocab:
    raise ConfigError(
        f'model.vocab_size={config.model.vocab_size} does not match the tokenizer '
        f'{getattr(tokenizer, "path", "")} (vocab_size {vocab}): allowed model.vocab_size={vocab}'
        f' (or a tokenizer with that vocabulary, data.tokenizer_vocab_size)')
  mode = config.model.separators
  try:
    fixed = model_config_lib.fixed_segment_length(mode)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if mode not in model_config_lib.SEPARATOR_MODES and not fixed:
    raise ConfigError(f'model.separators={mode!r} is invalid: must be one of '
                      f"{model_config_lib.SEPARATOR_MODES} or 'fixed:K'")
  _resolve_paragraph_ids(config, tokenizer)
  if fixed:  # segments of K tokens: no separator ids
    with config.unlocked() if hasattr(config, 'unlocked') else _null():
      config.model.separator_ids = ()
  elif mode != 'ids':
    rule = mode
    if mode == 'auto':  # the dataset's kind decides: newlines for code, sentences for text
      from bipe_jax.data import preparation  # pylint: disable=g-import-not-at-top
      rule = preparation.default_separator_rule(config.data)
    try:
      ids = tuple(int(i) for i in tokenizer.separator_ids(rule))
    except ValueError as e:
      raise ConfigError(f'model.separators={mode!r}: {e}') from None
    with config.unlocked() if hasattr(config, 'unlocked') else _null():
      config.model.separator_ids = ids
  try:  # an inter-stream original length is filled next, from the data (position_stats)
    return model_config_lib.model_config_from_dict(config.model, inter_length_later=True)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def _resolve_paragraph_ids(config, tokenizer) -> None:
  """Fills model.paragraph_ids of a hierarchical scheme (bipe3_rope) left empty with the
  tokenizer's newline pieces (a line is a paragraph); ConfigError when it has none."""
  from bipe_jax import schemes  # pylint: disable=g-import-not-at-top
  if not schemes.get_scheme(config.model.position_encoding).uses_paragraphs:
    return
  if config.model.get('paragraph_ids'):
    return
  ids = tuple(int(i) for i in tokenizer.separator_ids('newline'))
  if not ids:
    raise ConfigError(f'model.paragraph_ids is empty and the tokenizer '
                      f'{getattr(tokenizer, "path", "")} has no newline piece to end a paragraph:'
                      f' give model.paragraph_ids')
  with config.unlocked() if hasattr(config, 'unlocked') else _null():
    config.model.paragraph_ids = ids


class _null:
  def __enter__(self):
    return self

  def __exit__(self, *args):
    return False
