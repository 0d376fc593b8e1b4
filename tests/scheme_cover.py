"""The fewest schemes that between them use every value of every hook (bipe_jax.schemes).

A test that checks a mechanism common to all schemes (the kernels seam, the generation loop,
left padding) rather than one scheme's formula runs over `HOOK_COVER`: each input kind and its
stream, each rotary stream, each bias kind and its stream, each score transform is exercised at
least once, so a new hook value joins these tests by itself. tests/model/test_model.py's
`test_every_scheme` still runs every scheme (forward, blockwise == dense, causality, KV-cache
decoding, training).
"""

from bipe_jax import schemes


def _hook_values(scheme: schemes.Scheme) -> set:
  return {('input', scheme.input, scheme.input_stream), ('rotary', scheme.rotary),
          ('bias', scheme.bias), ('transform', scheme.transform),
          ('bias_stream', scheme.bias_stream if scheme.bias != 'none' else ''),
          ('fox_pro', scheme.fox_pro)}


def hook_cover(names=schemes.SCHEME_NAMES) -> tuple:
  """Schemes of `names` (registry order kept) chosen greedily until every hook value any of them
  uses is used by one: the scheme adding the most values not yet covered first."""
  values = {name: _hook_values(schemes.get_scheme(name)) for name in names}
  uncovered = set().union(*values.values())
  chosen = []
  while uncovered:
    best = max(names, key=lambda n: len(values[n] & uncovered))  # the first of equals
    chosen.append(best)
    uncovered -= values[best]
  return tuple(n for n in names if n in chosen)


HOOK_COVER = hook_cover()
