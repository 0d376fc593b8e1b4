"""tests/scheme_cover.py: HOOK_COVER uses every hook value of the registry, and the greedy cover
drops a scheme whose values the others already use."""

from bipe_jax import schemes
from tests import scheme_cover


def _values(names) -> set:
  return set().union(*(scheme_cover._hook_values(schemes.get_scheme(n)) for n in names))  # pylint: disable=protected-access


def test_the_cover_uses_every_hook_value_of_the_registry():
  assert _values(scheme_cover.HOOK_COVER) == _values(schemes.SCHEME_NAMES)
  assert len(scheme_cover.HOOK_COVER) < len(schemes.SCHEME_NAMES)
  assert {'cope', 'bipe3_rope', 'dapev2_kerple', 'fox_bias_only'} <= set(scheme_cover.HOOK_COVER)


def test_a_scheme_whose_values_are_covered_is_dropped():
  # rope first (ties go to the first), then bipe_rope (learned intra, inter rotary), then
  # sinusoidal (its input, no rotary): nope adds nothing left.
  assert scheme_cover.hook_cover(('rope', 'bipe_rope', 'sinusoidal', 'nope')) == (
      'rope', 'bipe_rope', 'sinusoidal')
  assert scheme_cover.hook_cover(('alibi', 'bipe_alibi')) == ('alibi', 'bipe_alibi')
