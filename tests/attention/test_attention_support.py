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
FOX = {'fox', 'fox_bias_only', 'bipe_fox', 'bipe_fox_bias_only'}  # a TPU-kernel bias kind
EXPECTED = {'auto': set(SCHEME_NAMES), 'dense': set(SCHEME_NAMES),
            'blockwise': set(SCHEME_NAMES), 'fused': FUSED,
            'cudnn': NO_BIAS,  # cuDNN refused ALiBi's per-key bias on an H200
            'pallas': PALLAS | FOX, 'pallas_gpu': PALLAS}


def test_the_table_names_every_implementation():
  assert set(support.SUPPORT) == set(attention.ATTENTION_IMPLS)


@pytest.mark.parametrize('impl', sorted(EXPECTED))
def test_which_schemes_each_implementation_computes(impl):
  assert {n for n in SCHEME_NAMES if support.supports(impl, get_scheme(n))} == EXPECTED[impl]


def test_an_unsupported_pair_is_one_line_naming_the_scheme_and_the_way_out():
  assert support.unsupported_reason('fused', get_scheme('rope')) is None
  reason = support.unsupported_reason('pallas', get_scheme('dape_kerple'))
  assert "not 'dape_kerple'" in reason and 'use blockwise or dense' in reason
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
