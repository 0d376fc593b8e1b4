"""The scheme registry: every name maps to the intended hooks; bad names and hooks fail clearly."""

import dataclasses

import pytest

from bipe_jax import schemes
from bipe_jax.schemes import SCHEME_NAMES, Scheme, get_scheme

# the schemes that read segments (the paper's BiPE family), written out by hand
BILEVEL = {'bipe_rope', 'bipe_alibi', 'bipe_kerple', 'bipe_fire', 'bipe_dape_kerple', 'bipe3_rope',
           'bipe_fox', 'bipe_fox_bias_only', 'bipe_fox_pro'}
FOX_PRO = {'fox_pro', 'bipe_fox_pro'}

# name -> (input, input_stream, rotary, bias, bias_stream, transform), written out by hand from
# the papers' descriptions (docs/design.md) (input_stream / bias_stream only where they matter).
EXPECTED = {
    'nope': ('none', None, 'none', 'none', None, 'none'),
    'sinusoidal': ('sinusoidal', 'token', 'none', 'none', None, 'none'),
    'learned': ('learned', 'token', 'none', 'none', None, 'none'),
    'rope': ('none', None, 'token', 'none', None, 'none'),
    'alibi': ('none', None, 'none', 'alibi', 'token', 'none'),
    'kerple': ('none', None, 'none', 'kerple', 'token', 'none'),
    'fire': ('none', None, 'none', 'fire', 'token', 'none'),
    't5': ('none', None, 'none', 't5', 'token', 'none'),
    'fox': ('none', None, 'none', 'fox', 'token', 'none'),
    'fox_bias_only': ('none', None, 'none', 'fox_bias_only', 'token', 'none'),
    'fox_pro': ('none', None, 'none', 'fox', 'token', 'none'),
    'cope': ('none', None, 'none', 'none', None, 'cope'),
    'dape_alibi': ('none', None, 'none', 'alibi', 'token', 'dape_v1'),
    'dape_kerple': ('none', None, 'none', 'kerple', 'token', 'dape_v1'),
    'dape_fire': ('none', None, 'none', 'fire', 'token', 'dape_v1'),
    'dapev2_kerple': ('none', None, 'none', 'kerple', 'token', 'dape_v2'),
    'bipe_rope': ('learned', 'intra', 'inter', 'none', None, 'none'),
    'bipe_alibi': ('learned', 'intra', 'none', 'alibi', 'inter', 'none'),
    'bipe_kerple': ('learned', 'intra', 'none', 'kerple', 'inter', 'none'),
    'bipe_fire': ('learned', 'intra', 'none', 'fire', 'inter', 'none'),
    'bipe_fox': ('learned', 'intra', 'none', 'fox', 'inter', 'none'),
    'bipe_fox_bias_only': ('learned', 'intra', 'none', 'fox_bias_only', 'inter', 'none'),
    'bipe_fox_pro': ('learned', 'intra', 'none', 'fox', 'inter', 'none'),
    'bipe_dape_kerple': ('learned', 'intra', 'none', 'kerple', 'inter', 'dape_v1'),
    'bipe3_rope': ('learned', 'intra', 'hierarchical', 'none', None, 'none'),
}


def test_names_are_exactly_the_spec_list():
  assert SCHEME_NAMES == tuple(EXPECTED)
  assert len(set(SCHEME_NAMES)) == 25


@pytest.mark.parametrize('name', SCHEME_NAMES)
def test_hooks(name):
  s = get_scheme(name)
  assert s.name == name
  inp, inp_stream, rotary, bias, bias_stream, transform = EXPECTED[name]
  assert (s.input, s.rotary, s.bias, s.transform) == (inp, rotary, bias, transform)
  if inp_stream is not None:
    assert s.input_stream == inp_stream
  if bias_stream is not None:
    assert s.bias_stream == bias_stream
  assert s.uses_learned_intra == (name in BILEVEL)
  assert s.bilevel == (name in BILEVEL)
  assert s.uses_paragraphs == (name == 'bipe3_rope')
  assert s.uses_learned_absolute == (name == 'learned')
  assert s.has_bias_or_transform == (bias != 'none' or transform != 'none')
  assert s.uses_forget_gate == bias.startswith('fox')
  assert s.fox_pro == (name in FOX_PRO)
  assert s.alibi_slope_factor == (96.0 if name == 'bipe_alibi' else 1.0)


def test_schemes_are_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    get_scheme('rope').rotary = 'inter'


def test_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match='unknown position_encoding') as err:
    get_scheme('bipe_xpos')
  for name in SCHEME_NAMES:
    assert name in str(err.value)


@pytest.mark.parametrize('field,value', [('input', 'rotary'), ('input_stream', 'document'),
                                         ('rotary', 'intra'), ('bias', 'xpos'),
                                         ('bias_stream', 'intra'), ('transform', 'dape_v3')])
def test_invalid_hook_values_are_rejected(field, value):
  with pytest.raises(ValueError, match=field):
    Scheme('custom', **{field: value})


def test_fox_pro_needs_a_forget_gate():
  with pytest.raises(ValueError, match='FoX Pro parts need a forget-gate bias'):
    Scheme('custom', bias='alibi', fox_pro=True)


def test_transform_needs_a_bias():
  with pytest.raises(ValueError, match='needs a bias'):
    Scheme('custom', transform='dape_v1')


def test_registry_is_consistent():
  assert set(schemes.SCHEMES) == set(SCHEME_NAMES)
  assert all(schemes.SCHEMES[n] is get_scheme(n) for n in SCHEME_NAMES)


def test_bilevel_is_a_property_of_the_hooks_not_of_the_name():
  """Any hook reading the intra or inter stream makes a scheme bilevel, whatever its name."""
  assert Scheme('x', rotary='inter').bilevel
  assert Scheme('x', bias='t5', bias_stream='inter').bilevel
  assert Scheme('x', input='sinusoidal', input_stream='intra').bilevel
  assert not Scheme('bipe_but_not', rotary='token').bilevel
  assert not Scheme('x', input_stream='intra').bilevel  # no input embedding: the stream is unread
  assert {n for n in SCHEME_NAMES if get_scheme(n).bilevel} == BILEVEL
