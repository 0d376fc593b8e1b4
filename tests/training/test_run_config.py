"""The run's config as typed, frozen sections (bipe_jax/run_config.py) and its pure resolution
(bipe_jax/training/resolve.py): defaults defined once, every preset valid, one-line errors, the
config never edited, set-up only from a resolved config."""

import dataclasses
import importlib
import inspect
import json
import os

import jax
import ml_collections
import numpy as np
import pytest

from bipe_jax import config as model_config_lib
from bipe_jax import defaults
from bipe_jax import run_config
from bipe_jax.run_config import ConfigError
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer
from bipe_jax.training import resolve as resolve_lib
from bipe_jax.training import setup as setup_lib
from tests import fixtures

ROOT = fixtures.ROOT
PRESETS = sorted(n[:-3] for n in os.listdir(os.path.join(ROOT, 'configs'))
                 if n.endswith('.py') and n not in ('__init__.py', 'base.py'))


def _preset(name):
  return importlib.import_module(f'configs.{name}').get_config()


def _json(section) -> str:
  """A section's values in the order a run records them (config.json)."""
  if hasattr(section, 'to_json_best_effort'):
    return json.dumps(json.loads(section.to_json_best_effort()))
  return json.dumps(section)


@pytest.mark.parametrize('name', sorted(run_config.SECTIONS))
def test_defaults_are_the_dataclass_defaults(name):
  section_type = run_config.SECTIONS[name]
  base = defaults.get_base_config()[name]
  assert base.to_dict() == run_config.default_fields(section_type)
  assert run_config.section_from_dict(name, base) == section_type()  # the defaults are valid
  assert _json(run_config.section_to_dict(section_type())) == _json(base)


def test_derived_properties():
  assert tuple(run_config.config_keys(run_config.MeshConfig)) == mesh_lib.MESH_AXES  # sizes order
  assert run_config.MeshConfig(fsdp=2, context=4).sizes == (-1, 2, 4, 1)
  assert run_config.CheckpointConfig().directory('/w') == '/w/checkpoints'
  assert run_config.CheckpointConfig(dir='gs://b/c').directory('/w') == 'gs://b/c'


def test_every_preset_builds_valid_typed_sections_recorded_as_given():
  assert len(PRESETS) >= 10 and 'tiny' in PRESETS
  for name in PRESETS:
    config = _preset(name)
    resolved = resolve_lib.resolve(config, device_count=1, placeholders=True)
    recorded = resolved.to_config_dict()
    for section in run_config.SECTIONS:  # the typed sections hold every value as given
      assert _json(recorded[section]) == _json(config[section]), (name, section)
    assert isinstance(resolved.model, model_config_lib.ModelConfig)


def test_unknown_fields_are_named():
  with pytest.raises(ConfigError, match=r"unknown train config fields \['stpes'\]"):
    run_config.section_from_dict('train', {'stpes': 3})
  with pytest.raises(ConfigError, match=r"unknown data config fields \['arithmetic_modulus'\]"):
    run_config.section_from_dict('data', {'arithmetic_modulus': 7})  # not the dataset's own
  data = run_config.section_from_dict('data', {'dataset': 'arithmetic', 'arithmetic_modulus': 7})
  assert data.task_fields == (('arithmetic_modulus', 7),)
  assert run_config.section_to_dict(data)['arithmetic_modulus'] == 7


@pytest.mark.parametrize('section,field,value,allowed', [
    ('data', 'seq_len', 1, 'must be an integer >= 2'),
    ('data', 'validation_fraction', 1.5, r'must be in \(0, 1\)'),
    ('data', 'tokenizer_model_type', 'wordpiece', 'must be one of'),
    ('train', 'b1', 1.0, r'must be in \[0, 1\)'),
    ('train', 'init_from_allow_encoding_change', 'yes', 'must be True or False'),
    ('checkpoint', 'async_save', 1, 'must be True or False'),
    ('checkpoint', 'keep', 0, 'must be an integer >= 1'),
    ('mesh', 'context', 0, 'must be a positive integer or -1'),
])
def test_a_bad_field_is_one_line_naming_field_value_and_what_is_allowed(section, field, value,
                                                                        allowed):
  with pytest.raises(ConfigError, match=f'^{section}.{field}={value!r} is invalid: {allowed}') \
      as info:
    run_config.section_from_dict(section, {field: value})
  assert '\n' not in str(info.value)


class _Tokenizer:
  path, vocab_size, bos_id, eos_id = 'toy.model', 4096, 1, 2

  def separator_ids(self, rule):
    return {'sentence': (13, 7), 'newline': (13,)}[rule]


def test_resolve_never_edits_its_config_and_gives_equal_results():
  config = _preset('tiny')
  config.model.rope_scaling, config.model.rope_scaling_factor = 'yarn', 4.0  # inter stream
  before = config.to_dict()
  facts = dict(device_count=1, tokenizer=_Tokenizer(), inter_original_length=9,
               init_source_seq_len=64, data_shards=2)
  first = resolve_lib.resolve(config, **facts)
  assert config.to_dict() == before
  assert resolve_lib.resolve(config, **facts) == first
  m = first.model  # what the run records
  assert (m.separator_ids, m.train_length, m.rope_original_length) == ((13, 7), 128, 9)
  assert first.train.data_shards == 2 and config.train.data_shards == 0
  recorded = first.to_config_dict().model
  assert (recorded.separator_ids, recorded.train_length) == ((13, 7), 128)
  config.model.position_encoding = 'rope'  # token units: the fine-tune source's seq_len
  assert resolve_lib.resolve(config, **facts).model.rope_original_length == 64


def test_unresolved_fields_stay_explicit_and_build_refuses_them():
  config = _preset('tiny')  # bipe_rope, model.separators='auto': ids from the tokenizer
  early = resolve_lib.resolve(config, device_count=1)  # the checks before any I/O
  assert early.model.separator_ids == ()
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))
  with pytest.raises(ValueError, match='model.separator_ids=.* is empty'):
    setup_lib.build(early, mesh)
  # ModelConfig's construction options are no fields: nothing ambient, nothing recorded
  relaxed = model_config_lib.ModelConfig(position_encoding='bipe_rope', require_separators=False)
  assert 'require_separators' not in {f.name for f in dataclasses.fields(relaxed)}
  assert 'require_separators' not in dataclasses.asdict(relaxed)
  assert not any(n in inspect.getsource(model_config_lib) for n in ('contextvars', 'ContextVar'))


def test_the_optimizer_takes_the_typed_train_section():
  section = ml_collections.ConfigDict(dict(learning_rate=1.0, warmup_steps=4, steps=12))
  typed = run_config.section_from_dict('train', section)
  for step in (0, 3, 8, 20):
    assert (float(optimizer.learning_rate_schedule(typed)(step))
            == float(optimizer.learning_rate_schedule(section)(step)))
  with pytest.raises(ConfigError, match="train.schedule='step' is invalid"):
    optimizer.make_optimizer(ml_collections.ConfigDict(dict(schedule='step')))
