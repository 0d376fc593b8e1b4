"""The run's config as frozen, validated sections: `DataConfig`, `TrainConfig`,
`CheckpointConfig`, `MeshConfig` (beside the model's `bipe_jax.config.ModelConfig`), and the
`RunConfig` holding all five.

  train = TrainConfig.from_dict(config.train)   # unknown keys: ConfigError naming them
  run = RunConfig(model=..., data=..., train=..., checkpoint=..., mesh=...)
  run.to_config_dict()                          # what a run records in config.json

Each section's dataclass fields are the one place its fields and defaults are defined
(bipe_jax/defaults.py builds the ConfigDict sections of `get_base_config()` from them). A
section checks every field when it is constructed and raises `ConfigError`, one line naming
the field, its value and what is allowed. Resolving a config (derived fields, separator ids
from the tokenizer, the device count) is `bipe_jax.training.resolve.resolve`.
"""

import dataclasses
import json
import math
import os
from typing import Any, Mapping, Tuple

import ml_collections

from bipe_jax import config as model_config_lib

SCHEDULES = ('linear', 'cosine', 'constant')  # train.schedule (bipe_jax/state/optimizer.py)
TOKENIZER_MODEL_TYPES = ('bpe', 'unigram')


class ConfigError(ValueError):
  """A config value that cannot work; the message is one line naming field and allowed values."""


def require(ok: bool, field: str, value: Any, allowed: str) -> None:
  """ConfigError '<field>=<value> is invalid: <allowed>' unless `ok`."""
  if not ok:
    raise ConfigError(f'{field}={value!r} is invalid: {allowed}')


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integers(section: str, cfg, minimums: Mapping[str, int]) -> None:
  for name, minimum in minimums.items():
    value = getattr(cfg, name)
    require(_is_int(value) and value >= minimum, f'{section}.{name}', value,
            f'must be an integer >= {minimum}')


def _strings(section: str, cfg, names) -> None:
  for name in names:
    require(isinstance(getattr(cfg, name), str), f'{section}.{name}', getattr(cfg, name),
            'must be a string')


def _flags(section: str, cfg, names) -> None:
  for name in names:
    require(isinstance(getattr(cfg, name), bool), f'{section}.{name}', getattr(cfg, name),
            'must be True or False')


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """config.data: the dataset, its tokenizer and the training rows."""
  dataset: str = 'embedded'  # embedded | text_folder | pile | pg19 | arxiv
  data_dir: str = 'data_cache'  # TFDS data_dir (prepared datasets and the embedded corpus)
  text_dir: str = ''  # for dataset=text_folder
  # dataset=pile: a folder of the Pile's .jsonl(.zst) files (bipe_jax/data/pile.py), the
  # meta.pile_set_name subsets kept ('' = all; aliases pg19, arxiv, github) and the splits built.
  pile_dir: str = ''
  pile_subsets: str = ''
  pile_splits: str = 'train,validation'
  tokenizer_path: str = ''  # '' = the tokenizer trained beside the data in data_dir
  tokenizer_sha256: str = ''  # recorded by a run (with its copy <workdir>/tokenizer.model)
  tokenizer_vocab_size: int = 4096
  seq_len: int = 128
  seed: int = 0
  prefetch: int = 2  # batches prefetched on a background thread (0 = none)
  tokenizer_model_type: str = 'bpe'  # bpe | unigram (for a tokenizer trained beside the data)
  text_field: str = 'text'  # JSON field holding the text in .jsonl files (text_folder)
  validation_fraction: float = 0.05  # documents held out for validation (embedded, text_folder)
  num_epochs: int = 0  # 0 = repeat the training split forever (reshuffled every epoch)
  # Tokenisation threads of the training pipeline (0 = in the caller). Sized for an accelerator
  # host, which has tens of cores; CPU presets set their own (configs/tiny.py: 2).
  num_threads: int = 16
  # Packed rows are shuffled in windows of this many rows, so a batch mixes many documents
  # (0 = rows in document order, as packed; see bipe_jax/data/packing.py).
  shuffle_window: int = 4096
  # A dataset's own fields, data.<dataset>_* (e.g. data.arithmetic_modulus of the generated
  # dataset 'arithmetic': read and checked by its task, bipe_jax/data/generated.py), as
  # (name, value) in the order given. Not a config key itself: the section holds them as given.
  task_fields: Tuple[Tuple[str, Any], ...] = dataclasses.field(default=(),
                                                               metadata={'config_key': False})

  def __post_init__(self):
    _strings('data', self, ('dataset', 'data_dir', 'text_dir', 'pile_dir', 'pile_subsets',
                            'pile_splits', 'tokenizer_path', 'tokenizer_sha256', 'text_field'))
    _integers('data', self, {'seq_len': 2, 'tokenizer_vocab_size': 1, 'seed': 0, 'prefetch': 0,
                             'num_epochs': 0, 'num_threads': 0, 'shuffle_window': 0})
    require(self.tokenizer_model_type in TOKENIZER_MODEL_TYPES, 'data.tokenizer_model_type',
            self.tokenizer_model_type, f'must be one of {TOKENIZER_MODEL_TYPES}')
    require(_is_num(self.validation_fraction) and 0 < self.validation_fraction < 1,
            'data.validation_fraction', self.validation_fraction, 'must be in (0, 1)')


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """config.train: steps, batch, optimizer and schedule (bipe_jax/state/optimizer.py), logging."""
  steps: int = 1000
  batch_size: int = 32  # global batch, in sequences
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  schedule: str = 'linear'  # linear (paper) | cosine | constant
  end_learning_rate_ratio: float = 0.0
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-8
  grad_clip: float = 1.0  # global-norm clipping; 0 = off
  grad_accum_steps: int = 1  # micro-batches per step (a scan inside the step); batch is global
  # The lm head and the loss in chunks of at most this many positions per batch shard, their
  # gradients in the same pass (training/chunked_loss.py): no [B, T, V] logits. 0 = the plain
  # logits. Sized by memory: one chunk's float32 logits are 4096 x V x 4 B (0.5 GiB at V=32000).
  # CPU presets set their own (configs/tiny.py: 512, measured fastest on the project's CPU).
  loss_chunk_tokens: int = 4096
  # Logical data shards: the global batch is the concatenation of `data_shards` pipelines, each
  # process reading its share; the same value gives the same batches for any process count
  # (and lets a run resume on another process count). 0 = one shard per data-loading process.
  data_shards: int = 0
  seed: int = 0
  # Fine-tune from a trained model: parameters only (fresh optimizer, step 0) from a workdir
  # ('DIR' or 'DIR@STEP') or a Hugging Face folder; see bipe_jax/training/init_from.py.
  init_from: str = ''
  # A fine-tune keeps its source's position streams (encoding, separators rule); True allows
  # another model.position_encoding / model.separators than the source's.
  init_from_allow_encoding_change: bool = False
  log_every: int = 10
  eval_every: int = 0  # steps between validation measurements (0 = none): training/validation.py
  eval_tokens: int = 16384  # validation tokens scored each time (a fixed slice of the split)
  # MFU denominator: peak FLOP/s of one device. 0 = by device kind (training/flops.py: published
  # peaks; on CPU the CPU seam's measured figure per host, shared by its fake devices).
  peak_flops_per_device: float = 0.0  # > 0 overrides

  def __post_init__(self):
    _integers('train', self, {'steps': 1, 'batch_size': 1, 'warmup_steps': 0,
                              'grad_accum_steps': 1, 'log_every': 1, 'seed': 0,
                              'data_shards': 0, 'eval_every': 0, 'eval_tokens': 1,
                              'loss_chunk_tokens': 0})
    lr = self.learning_rate
    require(_is_num(lr) and lr >= 0, 'train.learning_rate', lr, 'must be a finite number >= 0')
    require(self.schedule in SCHEDULES, 'train.schedule', self.schedule,
            f'must be one of {SCHEDULES}')
    ratio = self.end_learning_rate_ratio
    require(_is_num(ratio) and 0 <= ratio <= 1, 'train.end_learning_rate_ratio', ratio,
            'must be in [0, 1]')
    require(_is_num(self.weight_decay) and self.weight_decay >= 0, 'train.weight_decay',
            self.weight_decay, 'must be >= 0')
    for name in ('b1', 'b2'):
      value = getattr(self, name)
      require(_is_num(value) and 0 <= value < 1, f'train.{name}', value, 'must be in [0, 1)')
    require(_is_num(self.eps) and self.eps > 0, 'train.eps', self.eps, 'must be > 0')
    require(_is_num(self.grad_clip) and self.grad_clip >= 0, 'train.grad_clip', self.grad_clip,
            'must be >= 0 (0 = no clipping)')
    require(_is_num(self.peak_flops_per_device) and self.peak_flops_per_device >= 0,
            'train.peak_flops_per_device', self.peak_flops_per_device,
            "must be >= 0 (FLOP/s; 0 = the device kind's published peak)")
    _strings('train', self, ('init_from',))
    _flags('train', self, ('init_from_allow_encoding_change',))


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """config.checkpoint: how often and where the train state is saved."""
  every_steps: int = 100
  keep: int = 3
  async_save: bool = True
  dir: str = ''  # '' = <workdir>/checkpoints (`directory`)
  # When every existing checkpoint fails its integrity check, start again from step 0 instead
  # of stopping (the damaged ones are kept in <dir>_corrupt/).
  allow_fresh_start: bool = False

  def __post_init__(self):
    _integers('checkpoint', self, {'every_steps': 1, 'keep': 1})
    _flags('checkpoint', self, ('async_save', 'allow_fresh_start'))
    _strings('checkpoint', self, ('dir',))

  def directory(self, workdir: str) -> str:
    """Where the checkpoints of a run in `workdir` are: `dir`, or <workdir>/checkpoints."""
    return self.dir or os.path.join(workdir, 'checkpoints')


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """config.mesh: the device mesh's axis sizes, in the order of bipe_jax/state/mesh.py's
  MESH_AXES; -1 = the rest (filled for the device count: training/resolve.py)."""
  data: int = -1  # -1 = the remaining devices
  fsdp: int = 1
  context: int = 1  # > 1: the sequence is sharded over this many devices (context parallelism)
  tensor: int = 1

  def __post_init__(self):
    for name, value in zip(config_keys(MeshConfig), self.sizes):
      require(_is_int(value) and (value >= 1 or value == -1), f'mesh.{name}', value,
              'must be a positive integer or -1 (fill with the rest)')

  @property
  def sizes(self) -> tuple[int, ...]:
    """The configured sizes (data, fsdp, context, tensor)."""
    return (self.data, self.fsdp, self.context, self.tensor)


SECTIONS = {'data': DataConfig, 'train': TrainConfig, 'checkpoint': CheckpointConfig,
            'mesh': MeshConfig}


def config_keys(section_type) -> list[str]:
  """The fields of a section dataclass that are keys of its config section, in order."""
  return [f.name for f in dataclasses.fields(section_type) if f.metadata.get('config_key', True)]


def default_fields(section_type) -> dict[str, Any]:
  """Every config key of a section dataclass -> its default (the section of
  get_base_config())."""
  return {name: section_type.__dataclass_fields__[name].default
          for name in config_keys(section_type)}


def section_from_dict(name: str, values: Mapping[str, Any]):
  """config.<name> (ConfigDict or dict) -> its validated section; absent fields take their
  defaults, unknown ones are a ConfigError naming them (in the data section, the dataset's own
  data.<dataset>_* fields are kept: `DataConfig.task_fields`)."""
  section_type = SECTIONS[name]
  order = (list(json.loads(values.to_json_best_effort())) if hasattr(values, 'to_json_best_effort')
           else list(values))  # a ConfigDict's keys in the order they were set
  values = dict(values.to_dict() if hasattr(values, 'to_dict') else values)
  known = config_keys(section_type)
  if name == 'data':
    prefix = f'{values.get("dataset", DataConfig.dataset)}_'
    values['task_fields'] = tuple((k, values[k]) for k in order
                                  if k not in known and k.startswith(prefix))
    known = known + [k for k, _ in values['task_fields']] + ['task_fields']
  unknown = sorted(set(values) - set(known))
  if unknown:
    raise ConfigError(f'unknown {name} config fields {unknown}; known fields: {sorted(known)}')
  return section_type(**{k: v for k, v in values.items()
                         if k in section_type.__dataclass_fields__})


def section_to_dict(section) -> dict[str, Any]:
  """A section's config keys -> values (with a DataConfig's task fields), in order: the inverse
  of section_from_dict."""
  out = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)
         if f.metadata.get('config_key', True)}
  out.update(getattr(section, 'task_fields', ()))
  return out


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A run's whole config, every section typed (as `bipe_jax.training.resolve.resolve` makes it:
  derived fields filled, separator ids resolved)."""
  model: model_config_lib.ModelConfig
  data: DataConfig
  train: TrainConfig
  checkpoint: CheckpointConfig
  mesh: MeshConfig

  def to_config_dict(self) -> ml_collections.ConfigDict:
    """The ConfigDict of these values (sections and fields in definition order): what a run
    records in config.json, and what the ConfigDict readers of the library take."""
    return ml_collections.ConfigDict({
        name: section_to_dict(getattr(self, name))
        for name in ('model', 'data', 'train', 'checkpoint', 'mesh')})
