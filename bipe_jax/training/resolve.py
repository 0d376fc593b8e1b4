"""`resolve`: a run's ml_collections config -> its `RunConfig` (bipe_jax/run_config.py), every
section typed and checked, every derived field filled. Pure: the config is never edited, and
what needs I/O (the tokenizer, a fine-tune source's length, the data's segment statistics, a
checkpoint's data shard count) is gathered by the caller and passed in.

    early = resolve(config, device_count=n)                        # checks only: before any I/O
    run = resolve(config, device_count=n, tokenizer=tok)           # separator ids resolved
    run = resolve(config, device_count=n, tokenizer=tok, inter_original_length=k)

Filled from the config: model.train_length = data.seq_len (when 0); model.rope_original_length
= data.seq_len, or the fine-tune source's (`init_source_seq_len`), when 0. From the tokenizer
(model.separators 'auto' | 'sentence' | 'newline' | 'official' | 'ids' | 'fixed:K'):
model.separator_ids, and a hierarchical scheme's empty model.paragraph_ids; the vocab size and
BOS / EOS ids are checked against it. A field whose fact is not passed stays unresolved, and the
ModelConfig says so explicitly (`require_separators=False` / `inter_length_later=True`);
`training/setup.build` accepts only a fully resolved one. Errors are `ConfigError` (one line).
"""

import dataclasses
import difflib
from typing import Any, Mapping, Optional

from bipe_jax import config as model_config_lib
from bipe_jax import run_config as run_config_lib
from bipe_jax import schemes
from bipe_jax.run_config import ConfigError
from bipe_jax.run_config import require
from bipe_jax.runs import position_stats
from bipe_jax.state import mesh as mesh_lib

SECTION_NAMES = ('model', 'data', 'train', 'checkpoint', 'mesh')


def resolve(config, *, device_count: int, tokenizer: Any = None,
            separator_rule: Optional[str] = None, init_source_seq_len: Optional[int] = None,
            inter_original_length: Optional[int] = None, data_shards: Optional[int] = None,
            tokenizer_pin: Optional[Mapping[str, str]] = None,
            placeholders: bool = False) -> run_config_lib.RunConfig:
  """The RunConfig of `config` (configs/base.py sections) on `device_count` devices.

  tokenizer: resolves the separator ids (`vocab_size`, `bos_id`, `eos_id`, `path`,
    `separator_ids(rule)`); None leaves a rule's ids unresolved.
  separator_rule: what model.separators='auto' means for the dataset; None: computed here
    (`preparation.default_separator_rule`, which lists a text folder's files).
  init_source_seq_len: data.seq_len of the train.init_from workdir (a RoPE scaling's original
    length extends the source's training length); None: none.
  inter_original_length: an inter-stream rotary scaling's original length, in segments
    (runs/position_stats.py); None leaves it unresolved.
  data_shards: train.data_shards adopted from a checkpoint (training/data_shards.py).
  tokenizer_pin: the data fields recording the run's copy of its tokenizer
    (runs/tokenizer.pin_for_training: data.tokenizer_path, data.tokenizer_sha256).
  placeholders: fill what the compiled program depends on only as constants (separator ids, an
    inter-stream original length) with placeholders: an ahead-of-time compile.
  """
  _check_derivation_inputs(config)
  model = config.model.to_dict()
  seq_len = config.data.seq_len
  if placeholders:
    model.update(placeholder_fields(model, seq_len))
  if model['separators'] == 'official' and not config.data.get('tokenizer_path'):
    raise ConfigError("model.separators='official' means ids (869, 13) of the Llama tokenizer: "
                      'set data.tokenizer_path to its tokenizer.model (never downloaded), or '
                      "use a rule (model.separators='auto') with the data's own tokenizer")
  model.update(derived_fields(model, seq_len, init_source_seq_len))
  if inter_original_length is not None and position_stats.needs_inter_original_length(model):
    model['rope_original_length'] = int(inter_original_length)
  if tokenizer is not None:
    model.update(tokenizer_fields(model, config.data, tokenizer, separator_rule))
  try:
    model_config = model_config_lib.model_config_from_dict(
        model, require_separators=tokenizer is not None or model['separators'] == 'ids',
        inter_length_later=inter_original_length is None)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  data = dataclasses.replace(run_config_lib.section_from_dict('data', config.data),
                             **(tokenizer_pin or {}))
  train = config.train.to_dict()
  if data_shards is not None:
    train['data_shards'] = int(data_shards)
  train = run_config_lib.section_from_dict('train', train)
  checkpoint = run_config_lib.section_from_dict('checkpoint', config.checkpoint)
  mesh = run_config_lib.section_from_dict('mesh', config.mesh)
  check_layout(data, train, mesh, device_count)
  check_randomized_positions(model_config, data, mesh, device_count)
  return run_config_lib.RunConfig(model=model_config, data=data, train=train,
                                  checkpoint=checkpoint, mesh=mesh)


def _check_derivation_inputs(config) -> None:
  """The sections, and what the derived fields come from (the encoding's name, data.seq_len),
  so an error names the field the user set, not one derived from it."""
  for name in SECTION_NAMES:
    if name not in config:
      raise ConfigError(f'config has no section {name!r}; build configs from configs/base.py')
  name = config.model.position_encoding
  if name not in schemes.SCHEMES:
    close = difflib.get_close_matches(str(name), schemes.SCHEME_NAMES, n=1)
    hint = f'did you mean {close[0]!r}? ' if close else ''
    raise ConfigError(f'model.position_encoding={name!r} is invalid: {hint}must be one of '
                      f'{", ".join(schemes.SCHEME_NAMES)}')
  seq_len = config.data.seq_len
  require(isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len >= 2,
          'data.seq_len', seq_len, 'must be an integer >= 2')


def derived_fields(model: dict, seq_len: int, init_source_seq_len: Optional[int]) -> dict:
  """The model fields left at 0 that derive from data.seq_len: train_length (FIRE's L0, RoPE's
  log-scale reference) and rope_original_length (a RoPE scaling's original length; a
  fine-tune's is its source's data.seq_len; an inter-stream one is in segments, left 0 here:
  runs/position_stats.py). Explicitly set values are kept."""
  out = {}
  if not model.get('train_length'):
    out['train_length'] = int(seq_len)
  if not model.get('rope_original_length') and not position_stats.needs_inter_original_length(
      model):
    out['rope_original_length'] = int(init_source_seq_len or seq_len)
  return out


def placeholder_fields(model: dict, seq_len: int) -> dict:
  """What training resolves from the data, which a compiled program depends on only as
  constants: separator ids (a lookup table's values) and an inter-stream RoPE original length
  (a scale)."""
  out = {}
  if not tuple(model.get('separator_ids', ())):
    out.update(separators='ids', separator_ids=(min(13, int(model['vocab_size']) - 1),))
  if position_stats.needs_inter_original_length({**model, **out}):
    out['rope_original_length'] = max(1, int(seq_len) // 16)
  return out


def tokenizer_fields(model: dict, data_config, tokenizer,
                     separator_rule: Optional[str] = None) -> dict:
  """model.separator_ids (and a hierarchical scheme's empty paragraph_ids) resolved from the
  tokenizer, after checking the vocab size and BOS / EOS ids agree with it.

  model.separators: 'auto' (`separator_rule`: the dataset's rule, 'newline' for code folders,
  else 'sentence'), 'sentence', 'newline' or 'official' ({869, 13}, checked against the
  tokenizer's pieces) give the ids; 'ids' keeps the given ids; 'fixed:K' has none.
  """
  path = getattr(tokenizer, 'path', '')
  for field in ('bos_id', 'eos_id'):
    want = int(getattr(tokenizer, field))
    if int(model[field]) != want:
      raise ConfigError(f'model.{field}={model[field]} does not match the tokenizer {path} '
                        f'({field} {want}): set model.{field}={want}')
  vocab = tokenizer.vocab_size
  if model['vocab_size'] != vocab:
    raise ConfigError(
        f'model.vocab_size={model["vocab_size"]} does not match the tokenizer {path} '
        f'(vocab_size {vocab}): allowed model.vocab_size={vocab} (or a tokenizer with that '
        f'vocabulary, data.tokenizer_vocab_size)')
  mode = model['separators']
  try:
    fixed = model_config_lib.fixed_segment_length(mode)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if mode not in model_config_lib.SEPARATOR_MODES and not fixed:
    raise ConfigError(f'model.separators={mode!r} is invalid: must be one of '
                      f"{model_config_lib.SEPARATOR_MODES} or 'fixed:K'")
  out = {}
  if (schemes.get_scheme(model['position_encoding']).uses_paragraphs
      and not model.get('paragraph_ids')):
    out['paragraph_ids'] = tuple(int(i) for i in tokenizer.separator_ids('newline'))
    if not out['paragraph_ids']:
      raise ConfigError(f'model.paragraph_ids is empty and the tokenizer {path} has no newline '
                        f'piece to end a paragraph: give model.paragraph_ids')
  if fixed:  # segments of K tokens: no separator ids
    out['separator_ids'] = ()
  elif mode != 'ids':
    rule = mode
    if mode == 'auto':  # the dataset's kind decides: newlines for code, sentences for text
      if separator_rule is None:
        from bipe_jax.data import preparation  # pylint: disable=g-import-not-at-top
        separator_rule = preparation.default_separator_rule(data_config)
      rule = separator_rule
    try:
      out['separator_ids'] = tuple(int(i) for i in tokenizer.separator_ids(rule))
    except ValueError as e:
      raise ConfigError(f'model.separators={mode!r}: {e}') from None
  return out


def check_randomized_positions(model: model_config_lib.ModelConfig,
                               data: run_config_lib.DataConfig, mesh: run_config_lib.MeshConfig,
                               device_count: int) -> None:
  """model.randomized_positions=L draws data.seq_len distinct positions of 0..L-1 per row,
  whole rows (no context axis)."""
  big_l = model.randomized_positions
  if not big_l:
    return
  require(big_l >= data.seq_len, 'model.randomized_positions', big_l,
          f'must be 0 (off) or >= data.seq_len={data.seq_len} (a row takes seq_len distinct '
          f'positions of 0..L-1)')
  shape = mesh_lib.resolve_mesh_shape(mesh.sizes, device_count)
  require(shape[mesh_lib.MESH_AXES.index(mesh_lib.CONTEXT_AXIS)] == 1,
          'model.randomized_positions', big_l, 'needs mesh.context=1 (each row draws its '
          'positions whole)')


def check_layout(data: run_config_lib.DataConfig, train: run_config_lib.TrainConfig,
                 mesh: run_config_lib.MeshConfig, device_count: int) -> tuple[int, ...]:
  """Checks the mesh against the device count, the global batch against the batch shards and
  data.seq_len against the context shards; returns the mesh shape (data, fsdp, context,
  tensor)."""
  try:
    shape = mesh_lib.resolve_mesh_shape(mesh.sizes, device_count)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  shards = shape[0] * shape[1]
  accum = train.grad_accum_steps
  require(train.batch_size % (shards * accum) == 0, 'train.batch_size', train.batch_size,
          f'must be a multiple of the batch shards mesh.data*mesh.fsdp={shards} times '
          f'train.grad_accum_steps={accum} (= {shards * accum})')
  context = shape[mesh_lib.MESH_AXES.index(mesh_lib.CONTEXT_AXIS)]
  require(data.seq_len % context == 0, 'data.seq_len', data.seq_len,
          f'must be a multiple of mesh.context={context} (each context shard holds '
          f'seq_len / context tokens)')
  return shape
