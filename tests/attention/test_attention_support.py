"""The table of which attention implementation computes which scheme (attention/support.py)."""

import pytest

from bipe_jax import attention
from bipe_jax.attention import support
from bipe_jax.config import ModelConfig
from bipe_jax.schemes import SCHEME_NAMES, get_scheme

# written out by hand from the kernels' contracts (attention/core.py, attention/pallas/)
NO_BIAS = {'nope', 'sinusoidal', 'learned', 'rope', 'bipe_rope', 'bipe3_rope'}
FUSED = NO_BIAS | {'alibi', 'bipe_alibi'}
PALLAS = FUSED | {'kerple', 't5', 'bipe_kerple'}
FOX = {'fox', 'fox_bias_only', 'bipe_fox', 'bipe_fox_bias_only', 'fox_pro',
       'bipe_fox_pro'}  # a TPU-kernel bias kind
DAPE_FUSED = {'dape_alibi', 'dape_kerple', 'bipe_dape_kerple'}  # DAPE V1 in the kernels
EXPECTED = {'auto': set(SCHEME_NAMES), 'dense': set(SCHEME_NAMES),
            'blockwise': set(SCHEME_NAMES), 'fused': FUSED,
            'cudnn': NO_BIAS,  # cuDNN refused ALiBi's per-key bias on an H200
            'pallas': PALLAS | FOX | DAPE_FUSED, 'pallas_gpu': PALLAS | DAPE_FUSED}


def test_the_table_names_every_implementation():
  assert set(support.SUPPORT) == set(attention.ATTENTION_IMPLS)


@pytest.mark.parametrize('impl', sorted(EXPECTED))
def test_which_schemes_each_implementation_computes(impl):
  assert {n for n in SCHEME_NAMES if support.supports(impl, get_scheme(n))} == EXPECTED[impl]


def test_an_unsupported_pair_is_one_line_naming_the_scheme_and_the_way_out():
  assert support.unsupported_reason('fused', get_scheme('rope')) is None
  reason = support.unsupported_reason('pallas', get_scheme('dapev2_kerple'))
  assert "not 'dapev2_kerple'" in reason and 'use blockwise or dense' in reason
  assert not support.supports('nope_impl', get_scheme('rope'))
  assert 'nope_impl' in support.unsupported_reason('nope_impl', get_scheme('rope'))


@pytest.mark.parametrize('impl', attention.ATTENTION_IMPLS)
def test_model_config_refuses_exactly_what_the_table_refuses(impl):
  for name in SCHEME_NAMES:
    fields = dict(position_encoding=name, attention_impl=impl, separator_ids=(3,),
                  vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, ffn_size=32,
                  max_position=64, max_intra=64, block_size=16, train_length=64)
    if name in EXPECTED[impl]:
      ModelConfig(**fields)
    else:
      with pytest.raises(ValueError, match=f'attention_impl={impl!r} is invalid:.*{name!r}'):
        ModelConfig(**fields)


# 'auto' (the library default): the fastest path per (platform, scheme), written out by hand
TRANSFORMED = {'cope', 'dape_alibi', 'dape_kerple', 'dape_fire', 'dapev2_kerple',
               'bipe_dape_kerple'}  # a score transform: only DAPE_FUSED has kernels
FIRE = {'fire', 'bipe_fire'}  # an MLP bias: no tile-bias kind
FORGET = FOX | {n for n in SCHEME_NAMES if get_scheme(n).bias in ('fox', 'fox_bias_only')}
assert NO_BIAS | (PALLAS - NO_BIAS) | FORGET | TRANSFORMED | FIRE == set(SCHEME_NAMES)
AUTO = {  # (platform, dtype) -> {scheme: choice}
    ('tpu', 'bfloat16'): {**dict.fromkeys(PALLAS | FORGET, 'pallas'),
                          **dict.fromkeys(DAPE_FUSED, 'pallas'),
                          **dict.fromkeys(TRANSFORMED - DAPE_FUSED | FIRE, 'blockwise')},
    ('gpu', 'bfloat16'): {**dict.fromkeys(NO_BIAS, 'cudnn'),
                          **dict.fromkeys(PALLAS - NO_BIAS, 'pallas_gpu'),  # DAPE: explicit
                          **dict.fromkeys(FORGET | TRANSFORMED | FIRE, 'blockwise')},
    # cuDNN's fused attention takes half precision only: the Triton kernel runs float32
    ('cuda', 'float32'): {**dict.fromkeys(PALLAS, 'pallas_gpu'),
                          **dict.fromkeys(FORGET | TRANSFORMED | FIRE, 'blockwise')},
    ('cpu', 'float32'): dict.fromkeys(SCHEME_NAMES, 'blockwise'),
}


@pytest.mark.parametrize('platform, dtype', sorted(AUTO))
def test_auto_picks_the_fastest_path_per_platform_and_scheme(platform, dtype):
  chosen = {n: support.resolve_attention_impl('auto', get_scheme(n), platform, dtype)
            for n in SCHEME_NAMES}
  assert chosen == AUTO[(platform, dtype)]
  for name, impl in chosen.items():  # the choice always computes the scheme
    assert support.supports(impl, get_scheme(name))


def test_auto_runs_an_encoder_with_a_bias_blockwise_and_keeps_explicit_choices():
  assert support.resolve_attention_impl('auto', get_scheme('alibi'), 'tpu', causal=False) == (
      'blockwise')
  assert support.resolve_attention_impl('auto', get_scheme('rope'), 'tpu', causal=False) == (
      'pallas')
  assert support.resolve_attention_impl('dense', get_scheme('rope'), 'tpu') == 'dense'


def test_auto_is_the_default_and_no_preset_sets_an_implementation():
  import importlib  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  assert ModelConfig.__dataclass_fields__['attention_impl'].default == 'auto'
  root = pathlib.Path(__file__).resolve().parents[2]
  presets = sorted(p.stem for p in (root / 'configs').glob('*.py') if p.stem != '__init__')
  assert 'paper_151m_tpu' in presets
  for name in presets:
    assert 'attention_impl' not in (root / 'configs' / f'{name}.py').read_text(), name
  config = importlib.import_module('configs.paper_151m_tpu').get_config('bipe_rope')
  assert config.model.attention_impl == 'auto'


class _Device:
  def __init__(self, platform):
    self.platform = platform


class _Mesh:
  def __init__(self, platform):
    import numpy as np  # pylint: disable=g-import-not-at-top
    self.devices = np.array([_Device(platform)], dtype=object)


@pytest.mark.parametrize('platform, want', [('tpu', 'pallas'), ('gpu', 'cudnn'),
                                            ('cpu', 'blockwise')])
def test_a_preset_resolves_for_the_mesh_it_runs_on(platform, want):
  """configs/paper_151m_tpu.py:bipe_rope (bfloat16) as the trainer and train/compile.py build
  it: 'auto' becomes the platform's kernel (platform_choices.config_for_mesh)."""
  import importlib  # pylint: disable=g-import-not-at-top
  from bipe_jax import platform_choices  # pylint: disable=g-import-not-at-top
  from bipe_jax.config import model_config_from_dict  # pylint: disable=g-import-not-at-top
  config = importlib.import_module('configs.paper_151m_tpu').get_config('bipe_rope')
  config.model.separator_ids = (13,)  # resolved from the tokenizer at start
  model = model_config_from_dict(config.model)
  assert model.attention_impl == 'auto'
  assert platform_choices.config_for_mesh(model, _Mesh(platform)).attention_impl == want


def test_auto_gives_the_tpu_kernel_tiles_mosaic_takes():
  from bipe_jax import platform_choices  # pylint: disable=g-import-not-at-top
  fields = dict(position_encoding='rope', vocab_size=32, hidden_size=16, num_layers=1,
                num_heads=2, ffn_size=32, max_position=64, max_intra=64, train_length=64)
  for block, on_tpu in ((16, 128), (128, 128), (200, 256), (256, 256)):
    model = ModelConfig(**fields, block_size=block)
    tpu = platform_choices.config_for_mesh(model, _Mesh('tpu'))
    assert (tpu.attention_impl, tpu.block_size) == ('pallas', on_tpu)
    assert platform_choices.config_for_mesh(model, _Mesh('cpu')).block_size == block
  explicit = ModelConfig(**fields, block_size=16, attention_impl='pallas')
  assert platform_choices.config_for_mesh(explicit, _Mesh('tpu')).block_size == 16  # kept
