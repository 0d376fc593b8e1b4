"""Hugging Face Llama format <-> bipe_jax: configuration fields and parameter trees, both ways.

Parameter names (PyTorch `nn.Linear` weights are [out, in]; ours are einsum kernels [in, ..., out]):

| Hugging Face Llama                               | bipe_jax (params/...)                       |
|--------------------------------------------------|---------------------------------------------|
| model.embed_tokens.weight [V, D]                 | embed/embedding [V, D]                      |
| model.embeds.0.weight [train_scale, D] (BiPE)    | intra_embed/embedding [max_intra, D]        |
| model.layers.{i}.input_layernorm.weight [D]      | layer_{i}/attention_norm/scale [D]          |
| model.layers.{i}.self_attn.q_proj.weight [H*Dh, D] | layer_{i}/attention/query/kernel [D, H, Dh] |
| model.layers.{i}.self_attn.k_proj.weight [G*Dh, D] | layer_{i}/attention/key/kernel [D, G, Dh]   |
| model.layers.{i}.self_attn.v_proj.weight [G*Dh, D] | layer_{i}/attention/value/kernel [D, G, Dh] |
| model.layers.{i}.self_attn.o_proj.weight [D, H*Dh] | layer_{i}/attention/out/kernel [H, Dh, D]   |
| model.layers.{i}.post_attention_layernorm.weight | layer_{i}/mlp_norm/scale [D]                |
| model.layers.{i}.mlp.gate_proj.weight [F, D]     | layer_{i}/mlp/gate/kernel [D, F]            |
| model.layers.{i}.mlp.up_proj.weight [F, D]       | layer_{i}/mlp/up/kernel [D, F]              |
| model.layers.{i}.mlp.down_proj.weight [D, F]     | layer_{i}/mlp/down/kernel [F, D]            |
| model.norm.weight [D]                            | final_norm/scale [D]                        |
| lm_head.weight [V, D] (absent when tied)         | lm_head/kernel [D, V]                       |

RoPE needs no permutation: Hugging Face Llama rotates halves (`rotate_half`) and so does
`bipe_jax.encodings.rope.apply_rope`.

Configuration: the released BiPE folders carry `rpe_type` (bipe_rope, bipe_alibi, rope, alibi) and
`train_scale` in config.json. They map to our encoding of the same name with the official-compat
options: separators {869, 13} (Llama tokenizer ids of '▁.' and newline), the intra table of
`train_scale` rows with positions clamped to its last row (which the official code keeps at zero via
`padding_idx=-1`), ALiBi slopes x96 for bipe_alibi, segments that do not restart at BOS, packed
documents that attend to each other. A plain Llama folder (no `rpe_type`) becomes `rope`.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

from flax.linen import meta
import numpy as np

from bipe_jax import schemes

OFFICIAL_SEPARATOR_IDS = (869, 13)
# config.json keys of an exported bipe_* model: the ids its segments are cut at and the rule
# that chose them ('sentence', 'newline', 'official', 'ids'); read back on import. The official
# PyTorch code ignores them and cuts at OFFICIAL_SEPARATOR_IDS: a model trained with other ids
# runs as trained only here.
SEPARATOR_IDS_KEY = 'bipe_separator_ids'
SEPARATOR_RULE_KEY = 'bipe_separator_rule'
HF_ENCODINGS = ('rope', 'alibi', 'bipe_rope', 'bipe_alibi')
# Official slope factors of the released ALiBi checkpoints (bipe_alibi multiplies slopes by 96).
OFFICIAL_SLOPE_FACTOR = {'alibi': 1.0, 'bipe_alibi': 96.0}
INTRA_WEIGHT = 'model.embeds.0.weight'
# An exported alibi / bipe_* folder carries its own PyTorch model (hf_modeling_bipe.py, written
# as MODELING_FILE) and a model_type that plain Llama does not load: transformers needs
# trust_remote_code=True, and then builds the model it is instead of a Llama without its positions.
BIPE_MODEL_TYPE = 'bipe_llama'
MODELING_FILE = 'modeling_bipe.py'
BIPE_AUTO_MAP = {'AutoConfig': 'modeling_bipe.BipeLlamaConfig',
                 'AutoModelForCausalLM': 'modeling_bipe.BipeLlamaForCausalLM'}
# Non-parameter buffers that older checkpoints saved with the weights; recomputed here.
_BUFFER_SUFFIXES = ('self_attn.rotary_emb.inv_freq', 'self_attn.alibi', 'self_attn.bias',
                    'self_attn.masked_bias')


def _rope_theta(hf: dict) -> float:
  params = hf.get('rope_parameters') or {}
  if 'rope_theta' in params:
    return float(params['rope_theta'])
  return float(hf.get('rope_theta', 10000.0))


def _rope_scaling(hf: dict) -> tuple:
  """Returns (scaling name, factor, original length) from rope_scaling / rope_parameters."""
  spec = hf.get('rope_scaling') or hf.get('rope_parameters') or {}
  kind = spec.get('rope_type', spec.get('type', 'default'))
  factor = float(spec.get('factor', 1.0) or 1.0)
  original = int(spec.get('original_max_position_embeddings',
                          hf.get('max_position_embeddings', 1024)))
  if kind in ('default', None):
    return 'none', 1.0, original
  if kind == 'linear':
    return 'linear', factor, original
  if kind == 'yarn':
    extra = {k: spec[k] for k in ('beta_fast', 'beta_slow', 'attention_factor', 'mscale',
                                  'mscale_all_dim') if spec.get(k) is not None}
    if extra and extra != {'beta_fast': 32, 'beta_slow': 1}:
      raise ValueError(f'config.json yarn options {extra} are not supported; allowed: the '
                       'defaults beta_fast=32, beta_slow=1, attention_factor=0.1*ln(factor)+1')
    return 'yarn', factor, original
  raise ValueError(
      f'config.json rope scaling type {kind!r} is not supported by the converter; supported: '
      "'default', 'linear', 'yarn' (dynamic NTK depends on the running length and has no exact "
      'equivalent here)')


def model_fields_from_hf_config(hf: dict, *,
                                separator_ids: Optional[Sequence[int]] = None) -> dict:
  """Maps a Hugging Face Llama config.json to overrides of our `config.model` fields.

  Args:
    hf: the parsed config.json.
    separator_ids: separators to use instead of the folder's own (`bipe_separator_ids`, written
      by bipe_jax's export) or else the official {869, 13} (for folders whose tokenizer is not
      Llama's).

  Returns:
    {field: value} for `configs/base.py` model_defaults(); separator_ids is a tuple.
  """
  model_type = hf.get('model_type', 'llama')
  if model_type not in ('llama', BIPE_MODEL_TYPE):
    raise ValueError(f'config.json model_type {model_type!r} is not supported; allowed: '
                     f"'llama', {BIPE_MODEL_TYPE!r}")
  act = hf.get('hidden_act', 'silu')
  if act != 'silu':
    raise ValueError(f"config.json hidden_act {act!r} is not supported; allowed: 'silu' (SwiGLU)")
  for flag in ('attention_bias', 'mlp_bias'):
    if hf.get(flag, False):
      raise ValueError(f'config.json {flag}=true is not supported: bipe_jax linear layers have '
                       'no biases (allowed: false)')
  encoding = hf.get('rpe_type', 'rope')
  if encoding not in HF_ENCODINGS:
    raise ValueError(f'config.json rpe_type {encoding!r} is unknown; allowed: {HF_ENCODINGS}')
  if hf.get('log_scale', False) and not encoding.endswith('rope'):
    raise ValueError(f'config.json log_scale=true with rpe_type {encoding!r} is not supported; '
                     'allowed: log_scale=false, or log_scale with rope / bipe_rope')

  vocab = int(hf['vocab_size'])
  hidden = int(hf['hidden_size'])
  heads = int(hf['num_attention_heads'])
  kv_heads = int(hf.get('num_key_value_heads') or heads)
  head_dim = int(hf.get('head_dim') or hidden // heads)
  max_len = int(hf.get('max_position_embeddings', 1024))
  train_scale = int(hf.get('train_scale', max_len))
  scaling, factor, original = _rope_scaling(hf)
  if separator_ids is None and hf.get(SEPARATOR_IDS_KEY):  # exported by bipe_jax
    separator_ids = tuple(hf[SEPARATOR_IDS_KEY])
  if separator_ids is None:
    separator_ids = tuple(i for i in OFFICIAL_SEPARATOR_IDS if i < vocab)
  separator_ids = tuple(int(i) for i in separator_ids)
  bad = [i for i in separator_ids if not 0 <= i < vocab]
  if bad:
    raise ValueError(f'separator ids {bad} are out of range for vocab_size {vocab}')
  bos = hf.get('bos_token_id')
  eos = hf.get('eos_token_id')
  if isinstance(eos, list):
    eos = eos[0] if eos else None
  return {
      'vocab_size': vocab,
      'hidden_size': hidden,
      'num_layers': int(hf['num_hidden_layers']),
      'num_heads': heads,
      'num_kv_heads': kv_heads,
      'head_dim': 0 if head_dim * heads == hidden else head_dim,
      'ffn_size': int(hf['intermediate_size']),
      'rms_eps': float(hf.get('rms_norm_eps', 1e-6)),
      'position_encoding': encoding,
      'max_intra': train_scale,
      'max_position': max_len,
      'rope_base': _rope_theta(hf),
      'rope_scaling': scaling,
      'rope_scaling_factor': factor,
      'rope_original_length': original,
      'alibi_slope_factor': OFFICIAL_SLOPE_FACTOR.get(encoding, 0.0),
      'separators': 'ids',
      'separator_ids': separator_ids,
      'bos_id': -1 if bos is None else int(bos),
      'eos_id': -1 if eos is None else int(eos),
      # The official models take no attention mask: no token is treated as padding.
      'pad_id': -1,
      'restart_at_documents': False,
      'mask_across_documents': False,
  }


def hf_config_from_model_fields(m) -> dict:
  """Maps our `config.model` fields (a dict or ConfigDict) to a Hugging Face config.json.

  A `rope` model becomes a standard `LlamaForCausalLM`; bipe_rope / alibi / bipe_alibi become the
  official BiPE format (rpe_type, train_scale, the official tensor names) with model_type
  'bipe_llama' and an `auto_map` to the folder's own modeling_bipe.py (hf_modeling_bipe.py), so
  `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` loads it as what it is
  and plain Llama loading refuses; only when our options equal the official ones (checked: slope
  factor). A bipe_* model's separator ids
  and rule go into `bipe_separator_ids` / `bipe_separator_rule` (the official code cuts at
  {869, 13} whatever they are).
  """
  encoding = m['position_encoding']
  if encoding not in HF_ENCODINGS:
    raise ValueError(f'model.position_encoding {encoding!r} has no Hugging Face Llama '
                     f'equivalent; allowed: {HF_ENCODINGS}')
  if m['restart_at_documents'] or m['mask_across_documents']:
    raise ValueError('model.restart_at_documents / model.mask_across_documents must be False to '
                     'export to the Llama format (its models see one unbroken stream)')
  if schemes.get_scheme(encoding).bilevel and not m['separator_ids']:
    raise ValueError(f'model.separator_ids is empty: a {encoding} model needs the separator ids '
                     f'its segments were cut at to be exported')
  if encoding in OFFICIAL_SLOPE_FACTOR:
    factor = m['alibi_slope_factor'] or OFFICIAL_SLOPE_FACTOR[encoding]
    if factor != OFFICIAL_SLOPE_FACTOR[encoding]:
      raise ValueError(f'model.alibi_slope_factor {factor} differs from the official '
                       f'{OFFICIAL_SLOPE_FACTOR[encoding]} for {encoding}')
  if m['rope_scaling'] not in ('none', 'linear'):
    raise ValueError(f"model.rope_scaling {m['rope_scaling']!r} cannot be exported; "
                     "allowed: 'none', 'linear'")
  heads = int(m['num_heads'])
  hidden = int(m['hidden_size'])
  rope = {'rope_type': 'default', 'rope_theta': float(m['rope_base'])}
  scaling = None
  if m['rope_scaling'] == 'linear':
    rope = dict(rope, rope_type='linear', factor=float(m['rope_scaling_factor']))
    scaling = {'type': 'linear', 'rope_type': 'linear', 'factor': float(m['rope_scaling_factor'])}
  hf = {
      'architectures': ['LlamaForCausalLM'],
      'model_type': 'llama',
      'vocab_size': int(m['vocab_size']),
      'hidden_size': hidden,
      'intermediate_size': int(m['ffn_size']),
      'num_hidden_layers': int(m['num_layers']),
      'num_attention_heads': heads,
      'num_key_value_heads': int(m['num_kv_heads'] or heads),
      'head_dim': int(m['head_dim'] or hidden // heads),
      'hidden_act': 'silu',
      'rms_norm_eps': float(m['rms_eps']),
      'max_position_embeddings': int(m['max_position']),
      # Both spellings: `rope_theta`/`rope_scaling` (transformers 4.x), `rope_parameters` (5.x).
      'rope_theta': float(m['rope_base']),
      'rope_scaling': scaling,
      'rope_parameters': rope,
      'attention_bias': False,
      'mlp_bias': False,
      'tie_word_embeddings': False,
      'bos_token_id': None if m['bos_id'] < 0 else int(m['bos_id']),
      'eos_token_id': None if m['eos_id'] < 0 else int(m['eos_id']),
      'pad_token_id': None if m['pad_id'] < 0 else int(m['pad_id']),
      'torch_dtype': 'float32',
  }
  if encoding != 'rope':
    hf.update(rpe_type=encoding, train_scale=int(m['max_intra']), log_scale=False,
              architectures=['BipeLlamaForCausalLM'], model_type=BIPE_MODEL_TYPE,
              auto_map=dict(BIPE_AUTO_MAP))
  if schemes.get_scheme(encoding).bilevel:
    hf[SEPARATOR_IDS_KEY] = sorted(int(i) for i in m['separator_ids'])
    hf[SEPARATOR_RULE_KEY] = str(m.get('separators', 'ids'))
  return hf


def _dims(m) -> tuple:
  """(L, D, H, G, Dh, F, V) from model fields (0 means default for kv heads / head dim)."""
  heads = int(m['num_heads'])
  head_dim = int(m['head_dim'] or int(m['hidden_size']) // heads)
  return (int(m['num_layers']), int(m['hidden_size']), heads, int(m['num_kv_heads'] or heads),
          head_dim, int(m['ffn_size']), int(m['vocab_size']))


def _uses_intra_table(m) -> bool:
  return schemes.get_scheme(m['position_encoding']).bilevel


def params_from_hf_weights(weights: Dict[str, np.ndarray], m, *,
                           tie_word_embeddings: bool = False) -> dict:
  """Maps Hugging Face tensors to our parameter tree (the part under `params`), float32.

  Args:
    weights: {name: array} as read from the folder.
    m: our model fields (model_fields_from_hf_config's output or a ConfigDict).
    tie_word_embeddings: lm_head is the transposed token embedding (no lm_head.weight stored).

  Raises:
    ValueError: a tensor is missing, has the wrong shape, or is not recognised.
  """
  num_layers, d, h, g, dh, f, v = _dims(m)
  used = set()

  def take(name, shape):
    if name not in weights:
      raise ValueError(f'the checkpoint has no tensor {name!r} (expected shape {shape})')
    x = np.asarray(weights[name], dtype=np.float32)
    if x.shape != tuple(shape):
      raise ValueError(f'tensor {name!r} has shape {x.shape}; expected {tuple(shape)} from '
                       'config.json')
    used.add(name)
    return x

  embed = take('model.embed_tokens.weight', (v, d))
  params = {'embed': {'embedding': embed}}
  if _uses_intra_table(m):
    params['intra_embed'] = {'embedding': take(INTRA_WEIGHT, (int(m['max_intra']), d))}
  for i in range(num_layers):
    p = f'model.layers.{i}.'
    q = take(p + 'self_attn.q_proj.weight', (h * dh, d))
    k = take(p + 'self_attn.k_proj.weight', (g * dh, d))
    val = take(p + 'self_attn.v_proj.weight', (g * dh, d))
    o = take(p + 'self_attn.o_proj.weight', (d, h * dh))
    params[f'layer_{i}'] = {
        'attention_norm': {'scale': take(p + 'input_layernorm.weight', (d,))},
        'attention': {
            'query': {'kernel': q.T.reshape(d, h, dh)},
            'key': {'kernel': k.T.reshape(d, g, dh)},
            'value': {'kernel': val.T.reshape(d, g, dh)},
            'out': {'kernel': o.T.reshape(h, dh, d)},
        },
        'mlp_norm': {'scale': take(p + 'post_attention_layernorm.weight', (d,))},
        'mlp': {
            'gate': {'kernel': take(p + 'mlp.gate_proj.weight', (f, d)).T},
            'up': {'kernel': take(p + 'mlp.up_proj.weight', (f, d)).T},
            'down': {'kernel': take(p + 'mlp.down_proj.weight', (d, f)).T},
        },
    }
  params['final_norm'] = {'scale': take('model.norm.weight', (d,))}
  if tie_word_embeddings:
    params['lm_head'] = {'kernel': embed.T}  # a stored lm_head.weight is a copy: ignored
  else:
    if 'lm_head.weight' not in weights:
      raise ValueError("the checkpoint has no 'lm_head.weight' and config.json does not set "
                       'tie_word_embeddings=true')
    params['lm_head'] = {'kernel': take('lm_head.weight', (v, d)).T}
  unknown = sorted(n for n in weights if n not in used and not n.endswith(_BUFFER_SUFFIXES)
                   and not (tie_word_embeddings and n == 'lm_head.weight'))
  if unknown:
    raise ValueError(f'unrecognised tensors in the checkpoint for position_encoding '
                     f"{m['position_encoding']!r}: {unknown[:8]}{' ...' if len(unknown) > 8 else ''}")
  # Contiguous copies, so no array aliases the file buffers or another parameter.
  return _map_tree(params, np.ascontiguousarray)


def hf_weights_from_params(params: dict, m) -> Dict[str, np.ndarray]:
  """Maps our parameter tree (under `params`) to Hugging Face tensor names, float32 [out, in]."""
  num_layers, d, h, g, dh, f, v = _dims(m)
  params = _map_tree(meta.unbox(params), lambda x: np.asarray(x, dtype=np.float32))
  if 'layers' in params:  # scanned layers (model.scan_layers): one entry per layer
    from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
    params = model_lib.unstack_layer_params(params)
  out = {'model.embed_tokens.weight': params['embed']['embedding']}
  if _uses_intra_table(m):
    out[INTRA_WEIGHT] = params['intra_embed']['embedding']
    if m.get('intra_zero_last_row'):  # the row the model reads as zero is stored as zero
      out[INTRA_WEIGHT] = out[INTRA_WEIGHT].copy()
      out[INTRA_WEIGHT][-1] = 0.0
  for i in range(num_layers):
    p = f'model.layers.{i}.'
    layer = params[f'layer_{i}']
    att = layer['attention']
    out[p + 'input_layernorm.weight'] = layer['attention_norm']['scale']
    out[p + 'self_attn.q_proj.weight'] = att['query']['kernel'].reshape(d, h * dh).T
    out[p + 'self_attn.k_proj.weight'] = att['key']['kernel'].reshape(d, g * dh).T
    out[p + 'self_attn.v_proj.weight'] = att['value']['kernel'].reshape(d, g * dh).T
    out[p + 'self_attn.o_proj.weight'] = att['out']['kernel'].reshape(h * dh, d).T
    out[p + 'post_attention_layernorm.weight'] = layer['mlp_norm']['scale']
    out[p + 'mlp.gate_proj.weight'] = layer['mlp']['gate']['kernel'].T
    out[p + 'mlp.up_proj.weight'] = layer['mlp']['up']['kernel'].T
    out[p + 'mlp.down_proj.weight'] = layer['mlp']['down']['kernel'].T
  out['model.norm.weight'] = params['final_norm']['scale']
  out['lm_head.weight'] = params['lm_head']['kernel'].T
  del v
  return {k: np.ascontiguousarray(x) for k, x in out.items()}


def _map_tree(tree, fn):
  if isinstance(tree, dict) or hasattr(tree, 'items'):
    return {k: _map_tree(x, fn) for k, x in tree.items()}
  return fn(tree)
