"""The scheme registry: every name maps to the intended hooks; bad names and hooks fail clearly."""

import dataclasses

import pytest

from bipe_jax import schemes
from bipe_jax.schemes import SCHEME_NAMES, Scheme, get_scheme

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
    'bipe_dape_kerple': ('learned', 'intra', 'none', 'kerple', 'inter', 'dape_v1'),
}


def test_names_are_exactly_the_spec_list():
  assert SCHEME_NAMES == tuple(EXPECTED)
  assert len(set(SCHEME_NAMES)) == 22


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
  assert s.uses_learned_intra == name.startswith('bipe_')
  assert s.uses_learned_absolute == (name == 'learned')
  assert s.has_bias_or_transform == (bias != 'none' or transform != 'none')
  assert s.uses_forget_gate == bias.startswith('fox')
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


def test_transform_needs_a_bias():
  with pytest.raises(ValueError, match='needs a bias'):
    Scheme('custom', transform='dape_v1')


def test_registry_is_consistent():
  assert set(schemes.SCHEMES) == set(SCHEME_NAMES)
  assert all(schemes.SCHEMES[n] is get_scheme(n) for n in SCHEME_NAMES)
