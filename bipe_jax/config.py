"""`ModelConfig`: the model section of the ml_collections config as a frozen, validated dataclass.

  cfg = ModelConfig(position_encoding='bipe_rope', separator_ids=(13,), ...)  # validates itself
  cfg = model_config_from_dict(config.model)   # the same from a config section (unknown keys: error)

A ModelConfig checks every field when it is constructed (`validate_model_config`) and raises
ValueError naming the field. A config whose separator ids or inter-stream original length are
resolved later, at training start, says so explicitly when it is built:
`ModelConfig(..., require_separators=False, inter_length_later=True)` (construction options,
not fields: `dataclasses.fields` and the recorded config do not hold them).
"""

import dataclasses
from typing import Any, Mapping, Tuple

import jax.numpy as jnp

from bipe_jax.attention import support as attention_support
from bipe_jax import kernels
from bipe_jax import remat as remat_lib
from bipe_jax import schemes
from bipe_jax.encodings import randomized

OFFICIAL_SEPARATOR_IDS = (869, 13)  # Llama tokenizer: '▁.' and '<0x0A>' (official BiPE code)
SEPARATOR_MODES = ('auto', 'sentence', 'newline', 'official', 'ids')  # and 'fixed:K'
FIXED_PREFIX = 'fixed:'  # separators='fixed:K': a segment every K tokens (BiPE's ablation)


def fixed_segment_length(separators: str) -> int:
  """K of a separator rule 'fixed:K' (a positive integer), 0 for any other rule; ValueError
  naming the value when it starts with 'fixed:' but K is not a positive integer."""
  if not isinstance(separators, str) or not separators.startswith(FIXED_PREFIX):
    return 0
  k = separators[len(FIXED_PREFIX):]
  if not k.isdigit() or int(k) <= 0:
    raise _err('separators', separators, "'fixed:K' needs a positive integer K, e.g. 'fixed:16'")
  return int(k)

DTYPES = ('float32', 'bfloat16')
ROPE_SCALINGS = ('none', 'linear', 'ntk', 'yarn')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model section of a run's config: the one place its fields and defaults are defined
  (configs/base.py builds `config.model` from them)."""
  vocab_size: int = 4096
  hidden_size: int = 128
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 0  # 0 = same as num_heads (multi-head attention)
  head_dim: int = 0  # 0 = hidden_size // num_heads
  ffn_size: int = 512
  rms_eps: float = 1e-5
  position_encoding: str = 'bipe_rope'
  max_intra: int = 1024  # learned intra-segment table size (official: training length 1024)
  max_position: int = 1024  # learned absolute table size ('learned' encoding)
  intra_zero_last_row: bool = False  # official quirk: last intra row is zero (padding_idx=-1)
  train_length: int = 0  # RoPE log-scale ref., FIRE init_L = it // 4; 0 = data.seq_len (derived)
  rope_base: float = 10000.0
  rope_scaling: str = 'none'  # none | linear | ntk | yarn
  rope_scaling_factor: float = 1.0
  rope_original_length: int = 0  # RoPE scaling's original length; 0 = data.seq_len (derived)
  rope_log_scale: bool = False  # BiPE option: q *= log(pos + 1) / log(train_length)
  alibi_slope_factor: float = 0.0  # 0 = scheme default (96 for bipe_alibi, 1 otherwise)
  separators: str = 'auto'  # auto (tokenizer rule) | official ({869, 13}) | ids (separator_ids)
  separator_ids: Tuple[int, ...] = ()  # resolved at start when separators != 'ids'
  # Hierarchical BiPE (bipe3_rope): ids that end a paragraph (and its segment); resolved at
  # training start from the tokenizer's newline pieces when empty (empty: the row is one
  # paragraph). Other schemes ignore them.
  paragraph_ids: Tuple[int, ...] = ()
  bos_id: int = 1
  eos_id: int = 2
  pad_id: int = -1  # -1 = no padding token
  restart_at_documents: bool = False  # official BiPE: segments do not restart at BOS
  mask_across_documents: bool = False  # official: packed documents attend to each other
  # False: encoder mode, bidirectional attention (biases made two-sided: encodings/two_sided.py)
  causal: bool = True
  # auto | dense | blockwise | cudnn | fused | pallas | pallas_gpu (bipe_jax.attention.support:
  # which runs which scheme, and what 'auto' picks per platform: the fastest path that computes
  # the scheme, resolved by the mesh's platform; a run records its choice in config.json)
  attention_impl: str = 'auto'
  block_size: int = 128
  dtype: str = 'float32'  # compute dtype; float32 | bfloat16
  remat: Any = 'none'  # none | full | save_projections (False / True: none / full); remat.py
  # nn.scan over the decoder layers: one compiled layer body (compile time flat in depth);
  # parameters under 'layers' with a leading [num_layers] axis (model.stack_layer_params).
  scan_layers: bool = False
  # Compute forms (bipe_jax/kernels): portable (stock XLA forms for TPU / GPU) | cpu (tuned for
  # XLA CPU) | auto (cpu when the mesh's devices are CPU devices, else portable).
  kernels: str = 'auto'
  dape_hidden: int = 32
  dapev2_kernel: int = 3
  fire_hidden: int = 32
  fire_init_L: int = 0  # official init_L (noise_seq_length); 0 = train_length // 4 (see fire_L0)
  fire_halve_init_L: bool = True  # official Megatron: L0 = init_L // 2; False: DAPE.py, L0 = init_L
  t5_buckets: int = 32
  t5_max_distance: int = 128
  # Recipes (bipe_jax/encodings/recipes.py): p-RoPE fraction, NoPE every k-th layer, log-length
  # query scaling past train_length.
  rope_fraction: float = 1.0
  nope_every: int = 0
  query_log_scale: bool = False
  # FoX pruning (blockwise and pallas): skip key blocks whose attention weights are all below
  # exp(tolerance) (official log_pruning_tolerance, recommended -10); 0 = off.
  fox_log_pruning_tolerance: float = 0.0
  # FoX's forget gate: 'learned' (the scheme's: data-dependent for fox, a learned bias for
  # fox_bias_only) | 'fixed' (official fgate_type='fixed': constant gates whose decay times are
  # log-spaced from fox_decay_time_min to fox_decay_time_max across heads; encodings/fox_pro.py)
  fox_gate: str = 'learned'
  fox_decay_time_min: float = 0.0  # in tokens (segments for bilevel FoX); set both for 'fixed'
  fox_decay_time_max: float = 0.0
  cope_npos: int = 0  # CoPE's position vectors (official: block size + 1); 0 = max_position + 1
  # Randomized positions (Ruoss et al. 2023; bipe_jax/encodings/randomized.py): L > 0 gives each
  # row an ordered random subset of 0..L-1 as positions whenever the model is given a
  # `positions_rng` key (the train steps); 0 = off. The learned absolute table then has L rows.
  randomized_positions: int = 0
  # Construction options of the checks (validate_model_config), not fields: False / True accept
  # a config whose separator ids / inter-stream original length are resolved later. (Read on
  # an instance they give these class defaults; dataclasses.replace checks with the defaults.)
  require_separators: dataclasses.InitVar[bool] = True
  inter_length_later: dataclasses.InitVar[bool] = False

  def __post_init__(self, require_separators: bool, inter_length_later: bool):
    for field in ('separator_ids', 'paragraph_ids'):
      if isinstance(getattr(self, field), (list, tuple)):
        object.__setattr__(self, field, tuple(getattr(self, field)))
    validate_model_config(self, require_separators=require_separators,
                          inter_length_later=inter_length_later)

  # Derived values (no new fields, so the dataclass mirrors the config exactly).
  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def head_size(self) -> int:
    return self.head_dim or self.hidden_size // self.num_heads

  @property
  def scheme(self) -> schemes.Scheme:
    return schemes.get_scheme(self.position_encoding)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def fire_L0(self) -> int:
    """FIRE's threshold L0: init_L // 2 (official Megatron classes) or init_L (standalone
    DAPE.py); init_L defaults to train_length // 4, the released 512-token configs' 128."""
    init_l = self.fire_init_L or self.train_length // 4
    return init_l // 2 if self.fire_halve_init_L else init_l

  @property
  def fixed_segment_length(self) -> int:
    """K of separators='fixed:K' (a segment every K tokens), 0 otherwise."""
    return fixed_segment_length(self.separators)

  @property
  def cope_positions(self) -> int:
    return self.cope_npos or self.max_position + 1

  @property
  def position_table_size(self) -> int:
    """Rows of the learned absolute table: randomized_positions when set, else max_position."""
    return self.randomized_positions or self.max_position

  @property
  def slope_factor(self) -> float:
    return self.alibi_slope_factor or self.scheme.alibi_slope_factor


def default_fields() -> dict[str, Any]:
  """Every field of ModelConfig -> its default (the model section of configs/base.py)."""
  return {f.name: f.default for f in dataclasses.fields(ModelConfig)}


def _err(field: str, value: Any, allowed: str) -> ValueError:
  return ValueError(f'model.{field}={value!r} is invalid: {allowed}.')


def validate_model_config(cfg: ModelConfig, *, require_separators: bool = True,
                          inter_length_later: bool = False) -> ModelConfig:
  """Checks every field; raises ValueError naming the field and what is allowed. Returns cfg."""
  if cfg.position_encoding not in schemes.SCHEME_NAMES:
    raise _err('position_encoding', cfg.position_encoding,
               f'must be one of {", ".join(schemes.SCHEME_NAMES)}')
  try:
    remat_lib.remat_name(cfg.remat)
  except ValueError:
    raise _err('remat', cfg.remat, f'must be one of {remat_lib.REMAT_POLICIES} (or False / '
               'True for none / full)') from None
  positive = ('vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'ffn_size', 'max_intra',
              'max_position', 'block_size',
              'dape_hidden', 'dapev2_kernel', 'fire_hidden', 't5_buckets', 't5_max_distance')
  for field in positive:
    value = getattr(cfg, field)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise _err(field, value, 'must be a positive integer')
  for field in ('num_kv_heads', 'head_dim', 'fire_init_L', 'cope_npos', 'nope_every'):
    value = getattr(cfg, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise _err(field, value, 'must be an integer >= 0 (0 = derived default)')
  if not isinstance(cfg.fire_halve_init_L, bool):
    raise _err('fire_halve_init_L', cfg.fire_halve_init_L, 'must be True or False')
  if cfg.head_dim == 0 and cfg.hidden_size % cfg.num_heads:
    raise _err('hidden_size', cfg.hidden_size,
               f'must be divisible by num_heads={cfg.num_heads} when head_dim=0')
  if cfg.num_heads % cfg.kv_heads:
    raise _err('num_kv_heads', cfg.num_kv_heads,
               f'must divide num_heads={cfg.num_heads} (grouped-query attention)')
  if cfg.scheme.rotary != 'none' and cfg.head_size % 2:
    raise _err('head_dim', cfg.head_size, 'must be even for rotary encodings')
  if not cfg.rms_eps > 0:
    raise _err('rms_eps', cfg.rms_eps, 'must be > 0')
  if not cfg.rope_base > 1:
    raise _err('rope_base', cfg.rope_base, 'must be > 1')
  if cfg.rope_scaling not in ROPE_SCALINGS:
    raise _err('rope_scaling', cfg.rope_scaling, f'must be one of {ROPE_SCALINGS}')
  if not cfg.rope_scaling_factor >= 1:
    raise _err('rope_scaling_factor', cfg.rope_scaling_factor, 'must be >= 1')
  for field in ('train_length', 'rope_original_length'):  # 0 = not set: derived from seq_len
    value = getattr(cfg, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise _err(field, value, 'must be an integer >= 0 (0 = data.seq_len, derived at start)')
  derive = ('is 0 (= data.seq_len) but was not derived: set it, or build the config through '
            'bipe_jax.training.resolve.resolve')
  if cfg.train_length == 0 and (cfg.rope_log_scale or cfg.scheme.bias == 'fire'):
    raise _err('train_length', 0, derive)
  # For inter-stream rotary the original length is in segments, resolved at training start from
  # the data (bipe_jax.runs.position_stats): allowed to be 0 until then.
  inter_later = inter_length_later and cfg.scheme.rotary == 'inter'
  if cfg.rope_original_length == 0 and cfg.rope_scaling != 'none' and not inter_later:
    raise _err('rope_original_length', 0, derive)
  if cfg.rope_log_scale and cfg.scheme.rotary == 'hierarchical':
    raise _err('rope_log_scale', True, f'is not defined for {cfg.position_encoding} (two '
               'rotary streams)')
  if not 0.0 <= cfg.rope_fraction <= 1.0:
    raise _err('rope_fraction', cfg.rope_fraction, 'must be in [0, 1] (1 = full RoPE)')
  if not cfg.fox_log_pruning_tolerance <= 0:
    raise _err('fox_log_pruning_tolerance', cfg.fox_log_pruning_tolerance,
               'must be a natural log < 0 (0 = off)')
  if cfg.fox_log_pruning_tolerance < 0 and not cfg.causal:
    raise _err('fox_log_pruning_tolerance', cfg.fox_log_pruning_tolerance,
               'prunes causal key blocks only: set it to 0 with model.causal=False')
  if cfg.fox_gate not in ('learned', 'fixed'):
    raise _err('fox_gate', cfg.fox_gate, "must be 'learned' or 'fixed'")
  if cfg.fox_gate == 'fixed':
    if not cfg.scheme.uses_forget_gate:
      raise _err('fox_gate', 'fixed', f'needs a FoX encoding, not {cfg.position_encoding}')
    if not 0 < cfg.fox_decay_time_min <= cfg.fox_decay_time_max:
      raise _err('fox_decay_time_min', cfg.fox_decay_time_min,
                 f"and fox_decay_time_max={cfg.fox_decay_time_max} must satisfy 0 < min <= max "
                 "with fox_gate='fixed'")
  if cfg.nope_every and cfg.scan_layers:
    raise _err('nope_every', cfg.nope_every, 'needs scan_layers=False (the layers differ)')
  if cfg.query_log_scale and cfg.train_length < 2:
    raise _err('train_length', cfg.train_length, 'must be >= 2 with query_log_scale')
  if cfg.rope_log_scale and cfg.train_length < 2:
    raise _err('train_length', cfg.train_length, 'must be >= 2 with rope_log_scale')
  if not cfg.alibi_slope_factor >= 0:
    raise _err('alibi_slope_factor', cfg.alibi_slope_factor, 'must be >= 0 (0 = default)')
  fixed = fixed_segment_length(cfg.separators)
  if cfg.separators not in SEPARATOR_MODES and not fixed:
    raise _err('separators', cfg.separators, f"must be one of {SEPARATOR_MODES} or 'fixed:K'")
  for field in ('separator_ids', 'paragraph_ids'):
    bad = [i for i in getattr(cfg, field)
           if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < cfg.vocab_size]
    if bad:
      raise _err(field, getattr(cfg, field),
                 f'ids {bad} are out of range: allowed 0..{cfg.vocab_size - 1}')
  if cfg.separators == 'ids' and not cfg.separator_ids:
    raise _err('separator_ids', cfg.separator_ids, "must not be empty with separators='ids'")
  if fixed and cfg.scheme.uses_paragraphs:
    raise _err('separators', cfg.separators, f'{cfg.position_encoding} needs text separators '
               "(paragraphs within sentences), not fixed-length segments")
  if (require_separators and cfg.scheme.bilevel and not cfg.separator_ids
      and not fixed):
    raise _err('separator_ids', cfg.separator_ids,
               f'is empty, so every token of a {cfg.position_encoding} model would be in segment '
               f'0: resolve model.separators={cfg.separators!r} from the tokenizer '
               f'(bipe_jax.training.resolve.resolve) or give the ids')
  for field in ('bos_id', 'eos_id', 'pad_id'):
    value = getattr(cfg, field)
    if not -1 <= value < cfg.vocab_size:
      raise _err(field, value, f'must be -1 (none) or in 0..{cfg.vocab_size - 1}')
  if cfg.restart_at_documents and cfg.bos_id < 0:
    raise _err('restart_at_documents', True, 'needs bos_id >= 0 (document starts are BOS)')
  if cfg.mask_across_documents and cfg.bos_id < 0:
    raise _err('mask_across_documents', True, 'needs bos_id >= 0 (document starts are BOS)')
  if cfg.attention_impl not in attention_support.ATTENTION_IMPLS:
    raise _err('attention_impl', cfg.attention_impl,
               f'must be one of {attention_support.ATTENTION_IMPLS}')
  if (reason := attention_support.unsupported_reason(cfg.attention_impl, cfg.scheme)):
    raise _err('attention_impl', cfg.attention_impl, reason)
  if cfg.attention_impl in attention_support.FUSED_IMPLS:
    if cfg.scheme.bias == 'alibi' and cfg.restart_at_documents and not cfg.mask_across_documents:
      raise _err('attention_impl', cfg.attention_impl,
                 f'runs {cfg.position_encoding!r} as a per-key bias, which needs positions '
                 'that never decrease between visible tokens: with restart_at_documents, set '
                 'mask_across_documents=True (or use blockwise)')
  if not cfg.causal and (cfg.scheme.transform == 'dape_v2' or cfg.scheme.bias != 'none' and (
      cfg.attention_impl in attention_support.TILE_BIAS_IMPLS
      or cfg.attention_impl in attention_support.FUSED_IMPLS)):
    raise _err('causal', cfg.causal,
               f'(encoder mode) runs on dense or blockwise attention (fused, cudnn and the Pallas '
               f'kernels only without a bias); attention_impl={cfg.attention_impl!r} with '
               f'{cfg.position_encoding!r} is causal-only (tile biases, per-key ALiBi, DAPE V2 '
               f'convolution)')
  value = cfg.randomized_positions
  if isinstance(value, bool) or not isinstance(value, int) or value < 0:
    raise _err('randomized_positions', value, 'must be an integer >= 0 (0 = off)')
  if cfg.randomized_positions and (why := randomized.refusal(cfg.scheme)):
    raise _err('randomized_positions', cfg.randomized_positions, f'must be 0: {why}')
  if cfg.kernels not in kernels.KERNELS:
    raise _err('kernels', cfg.kernels, f'must be one of {kernels.KERNELS}')
  if cfg.dtype not in DTYPES:
    raise _err('dtype', cfg.dtype, f'must be one of {DTYPES}')
  if cfg.dapev2_kernel % 2 != 1:
    raise _err('dapev2_kernel', cfg.dapev2_kernel, 'must be odd')
  if cfg.t5_max_distance <= cfg.t5_buckets // 2:
    raise _err('t5_max_distance', cfg.t5_max_distance,
               f'must exceed t5_buckets / 2 = {cfg.t5_buckets // 2}')
  return cfg


def model_config_from_dict(model: Mapping[str, Any], *,
                           require_separators: bool = True,
                           inter_length_later: bool = False) -> ModelConfig:
  """`config.model` (ConfigDict or dict) -> validated ModelConfig.

  Unknown keys are an error (typos would otherwise be silently ignored). separator_ids become a
  tuple; with separators='official' and no ids, the official Llama ids (869, 13) are used
  ('auto' ids are resolved from the tokenizer by the data pipeline before this call).
  A bipe_* scheme with no separator ids is an error unless `require_separators=False` (the
  check of a config whose ids are resolved later, at training start). `inter_length_later=True`
  accepts rope_original_length=0 for an inter-stream rotary scheme with a scaling: it is in
  segments, resolved at training start from the data (bipe_jax.runs.position_stats).
  """
  values = dict(model.to_dict() if hasattr(model, 'to_dict') else model)
  known = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(values) - known)
  if unknown:
    raise ValueError(f'unknown model config fields {unknown}; known fields: {sorted(known)}.')
  ids = values.get('separator_ids', ())
  if isinstance(ids, (int,)):
    ids = (ids,)
  values['separator_ids'] = tuple(int(i) for i in ids)
  paragraph = values.get('paragraph_ids', ())
  values['paragraph_ids'] = tuple(int(i) for i in ((paragraph,) if isinstance(paragraph, int)
                                                   else paragraph))
  if values.get('separators') == 'official' and not values['separator_ids']:
    values['separator_ids'] = OFFICIAL_SEPARATOR_IDS
  return ModelConfig(**values, require_separators=require_separators,
                     inter_length_later=inter_length_later)
