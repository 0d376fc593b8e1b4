"""ModelConfig: the source of configs/base.py's model section (defaults live once), validates every field with clear errors, counts params."""

import ast
import dataclasses
import importlib
import os

import pytest

from bipe_jax.config import ModelConfig, model_config_from_dict
from bipe_jax.model import count_params
from bipe_jax.schemes import SCHEME_NAMES, get_scheme
from configs import base
from tests import fixtures

PRESETS = ('tiny', 'rope_151m', 'bipe_rope_151m', 'bipe_alibi_151m', 'alibi_151m',
           'dape_kerple_125m')


def test_fields_mirror_base_config():
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  assert fields == set(base.model_defaults().keys())
  cfg = model_config_from_dict(base.model_defaults(), require_separators=False)
  for key, value in base.model_defaults().items():
    expected = tuple(value) if key == 'separator_ids' else value
    assert getattr(cfg, key) == expected, key


def test_model_defaults_are_the_model_configs():
  defaults = base.model_defaults()
  assert defaults.train_length == 0 and defaults.rope_original_length == 0  # = data.seq_len
  for f in dataclasses.fields(ModelConfig):
    assert defaults[f.name] == f.default, f.name


def _library_fallbacks() -> list[tuple[str, str, object]]:
  """(file, field, default) of every `x.get('field', constant)` in bipe_jax/."""
  root = os.path.join(fixtures.ROOT, 'bipe_jax')
  found = []
  for folder, _, files in os.walk(root):
    for name in (n for n in files if n.endswith('.py')):
      path = os.path.join(folder, name)
      with open(path) as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == 'get' and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)):
          try:
            default = ast.literal_eval(node.args[1])
          except ValueError:
            continue
          found.append((os.path.relpath(path, root), node.args[0].value, default))
  return found


# Fallbacks that are not config defaults, with why.
NOT_DEFAULTS = {
    ('separators', 'ids'): 'model fields of a Hugging Face import carry explicit separator ids',
    ('data', 1): "a compiled mesh's shape (compile/aot.py), not config.mesh",
}


def test_library_fallbacks_for_config_fields_agree_with_base():
  """Where the library reads a config field that may be absent (a run saved before the field
  existed, a hand-built section), its fallback is the base default, never another value."""
  config = base.get_base_config()
  defaults = {}
  for section in config.values():
    for key, value in section.items():
      defaults.setdefault(key, []).append(value)
  fallbacks = [(path, field, value) for path, field, value in _library_fallbacks()
               if field in defaults and (field, value) not in NOT_DEFAULTS]
  assert {'seed', 'dir'} <= {field for _, field, _ in fallbacks}  # the scan sees them
  disagree = [(path, field, value, defaults[field]) for path, field, value in fallbacks
              if not any(value == d or (isinstance(d, tuple) and tuple(value) == d)
                         for d in defaults[field])]
  assert disagree == []


@pytest.mark.parametrize('preset', PRESETS)
def test_presets_validate(preset):
  config = importlib.import_module(f'configs.{preset}').get_config()
  cfg = model_config_from_dict(config.model, require_separators=False)  # resolved at start
  assert cfg.position_encoding in SCHEME_NAMES
  assert isinstance(cfg.separator_ids, tuple)


@pytest.mark.parametrize('encoding', [n for n in SCHEME_NAMES if get_scheme(n).bilevel])
def test_bipe_without_separators_is_an_error(encoding):
  with pytest.raises(ValueError, match=f'separator_ids=.*is empty.*{encoding}'):
    model_config_from_dict(dict(position_encoding=encoding, train_length=64))
  assert model_config_from_dict(dict(position_encoding=encoding, train_length=64),
                                require_separators=False).separator_ids == ()
  assert model_config_from_dict(dict(position_encoding='rope')).separator_ids == ()


def test_derived_values():
  cfg = model_config_from_dict(dict(hidden_size=96, num_heads=6, num_kv_heads=2,
                                    separator_ids=(3,)))
  assert (cfg.head_size, cfg.kv_heads) == (16, 2)
  assert model_config_from_dict(dict(separator_ids=(3,))).kv_heads == 4
  assert model_config_from_dict(dict(position_encoding='bipe_alibi',
                                     separator_ids=(3,))).slope_factor == 96.0
  assert model_config_from_dict(dict(position_encoding='alibi')).slope_factor == 1.0
  assert model_config_from_dict(dict(position_encoding='bipe_alibi', separator_ids=(3,),
                                     alibi_slope_factor=8.0)).slope_factor == 8.0


def test_separator_ids_become_a_tuple_and_official_resolves():
  assert model_config_from_dict(dict(separator_ids=[7, 9])).separator_ids == (7, 9)
  official = model_config_from_dict(dict(vocab_size=32000, separators='official'))
  assert official.separator_ids == (869, 13)


BAD = [
    (dict(position_encoding='bipe_xpos'), 'position_encoding.*bipe_rope'),
    (dict(hidden_size=130, num_heads=4), 'hidden_size.*divisible by num_heads'),
    (dict(num_heads=4, num_kv_heads=3), 'num_kv_heads.*divide num_heads'),
    (dict(num_layers=0), 'num_layers.*positive'),
    (dict(vocab_size=-5), 'vocab_size.*positive'),
    (dict(block_size=0), 'block_size.*positive'),
    (dict(head_dim=-1), 'head_dim'),
    (dict(dtype='float16'), "dtype.*'float32', 'bfloat16'"),
    (dict(attention_impl='flash'), 'attention_impl.*dense.*blockwise.*cudnn'),
    (dict(attention_impl='cudnn', position_encoding='kerple'), 'attention_impl.*bias'),
    (dict(separator_ids=(3, 4096)), 'separator_ids.*4096.*0..4095'),
    (dict(separators='ids', separator_ids=()), 'separator_ids.*empty'),
    (dict(separators='regex'), 'separators.*auto'),
    (dict(rope_scaling='dynamic'), 'rope_scaling'),
    (dict(rope_scaling_factor=0.5), 'rope_scaling_factor'),
    (dict(pad_id=5000), 'pad_id'),
    (dict(bos_id=-1, restart_at_documents=True), 'restart_at_documents.*bos_id'),
    (dict(dapev2_kernel=4), 'dapev2_kernel.*odd'),
    (dict(t5_buckets=32, t5_max_distance=10), 't5_max_distance'),
    (dict(rms_eps=0.0), 'rms_eps'),
    (dict(hidden_size=36, num_heads=4, head_dim=9, position_encoding='rope'),
     'head_dim.*even'),
]


@pytest.mark.parametrize('overrides,message', BAD)
def test_validation_errors_name_the_field(overrides, message):
  with pytest.raises(ValueError, match=message):
    model_config_from_dict({'separator_ids': (3,), **overrides})


def test_unknown_field_is_an_error():
  with pytest.raises(ValueError, match='unknown model config fields.*num_layer'):
    model_config_from_dict(dict(num_layer=3))


def test_count_params_by_formula():
  cfg = model_config_from_dict(dict(vocab_size=100, hidden_size=16, num_layers=2, num_heads=4,
                                    num_kv_heads=2, ffn_size=24, max_intra=10,
                                    position_encoding='bipe_kerple', separator_ids=(3,)))
  d, g_dh, f, v = 16, 2 * 4, 24, 100
  per_layer = 2 * d + d * d + 2 * d * g_dh + d * d + 3 * d * f + 2 * 4  # norms, attn, mlp, kerple
  assert count_params(cfg) == 2 * v * d + 10 * d + d + 2 * per_layer
