"""The scheme registry: every `model.position_encoding` name as "which stream feeds which hook".

Position streams (bipe_jax.positions): token (0..T-1), intra (offset in the segment), inter
(segment index). Hooks (docs/design.md):
  input      add an absolute embedding of a stream to the token embeddings
             ('none' | 'sinusoidal' | 'learned'), indexed by `input_stream`;
  rotary     rotate q and k by a stream ('none' | 'token' | 'inter'), or by the two upper
             levels of hierarchical BiPE ('hierarchical': sentence-in-paragraph and paragraph
             indices on alternate frequencies, bipe_jax/encodings/hierarchical.py);
  bias       an additive [B, H, Q, K] logit bias ('none' | 'alibi' | 'kerple' | 'fire' | 't5'),
             computed from `bias_stream` ('token' | 'inter'); or a forget-gate bias
             ('fox': data-dependent, 'fox_bias_only': data-independent; encodings/fox.py),
             gated at every token ('token') or only at segment starts ('inter': bilevel);
  transform  a function of (scores, bias) over all heads ('none' | 'dape_v1' | 'dape_v2'), or
             of the scores and the queries ('cope': encodings/cope.py, dense only);
  fox_pro    FoX's Pro parts around the attention core (encodings/fox_pro.py).

The model reads a `Scheme` and never branches on the name, so a new combination is one line here.
"""

import dataclasses
from typing import Dict, Tuple

INPUT_KINDS = ('none', 'sinusoidal', 'learned')
STREAMS = ('token', 'intra', 'inter')
ROTARY_KINDS = ('none', 'token', 'inter', 'hierarchical')
BIAS_KINDS = ('none', 'alibi', 'kerple', 'fire', 't5', 'fox', 'fox_bias_only')
FOX_KINDS = ('fox', 'fox_bias_only')  # biases c_i - c_j from forget gates (float streams)
TRANSFORM_KINDS = ('none', 'dape_v1', 'dape_v2', 'cope')


@dataclasses.dataclass(frozen=True)
class Scheme:
  """One positional scheme as hook settings.

  Attributes:
    name: the registry name.
    input: absolute embedding added at the input ('none' | 'sinusoidal' | 'learned').
    input_stream: the stream indexing it ('token' | 'intra'); learned(token) uses the
      `abs_embed` table (size max_position), learned(intra) the `intra_embed` table (max_intra).
    rotary: the stream RoPE rotates q and k by ('none' | 'token' | 'inter' | 'hierarchical').
    bias: additive logit bias ('none' | 'alibi' | 'kerple' | 'fire' | 't5' | 'fox' |
      'fox_bias_only').
    bias_stream: the stream the bias is a function of ('token' | 'inter').
    transform: score transform ('none' | 'dape_v1' | 'dape_v2' | 'cope').
    alibi_slope_factor: slope multiplier used when `model.alibi_slope_factor` is 0 (96 for
      BiPE-ALiBi, as the official code; 1 for ALiBi).
    fox_pro: FoX's Pro parts around the attention core (key / value shift, QK-norm, gated
      output norm: encodings/fox_pro.py); only with a forget-gate bias.
  """
  name: str
  input: str = 'none'
  input_stream: str = 'token'
  rotary: str = 'none'
  bias: str = 'none'
  bias_stream: str = 'token'
  transform: str = 'none'
  alibi_slope_factor: float = 1.0
  fox_pro: bool = False

  def __post_init__(self):
    checks = (('input', self.input, INPUT_KINDS), ('input_stream', self.input_stream, STREAMS),
              ('rotary', self.rotary, ROTARY_KINDS), ('bias', self.bias, BIAS_KINDS),
              ('bias_stream', self.bias_stream, ('token', 'inter')),
              ('transform', self.transform, TRANSFORM_KINDS))
    for field, value, allowed in checks:
      if value not in allowed:
        raise ValueError(f'Scheme {self.name!r}: {field}={value!r} is not one of {allowed}.')
    if self.transform.startswith('dape') and self.bias == 'none':
      raise ValueError(f'Scheme {self.name!r}: a DAPE transform needs a bias to adapt.')
    if self.fox_pro and self.bias not in FOX_KINDS:
      raise ValueError(f'Scheme {self.name!r}: the FoX Pro parts need a forget-gate bias.')

  @property
  def uses_learned_intra(self) -> bool:
    return self.input == 'learned' and self.input_stream == 'intra'

  @property
  def uses_learned_absolute(self) -> bool:
    return self.input == 'learned' and self.input_stream == 'token'

  @property
  def bilevel(self) -> bool:
    """Reads the segment streams (intra or inter): needs separator ids to cut the segments,
    and exports to the released BiPE format (its intra table, its separator ids)."""
    return (self.input_stream == 'intra' and self.input != 'none'
            or self.rotary in ('inter', 'hierarchical')
            or self.bias != 'none' and self.bias_stream == 'inter')

  @property
  def uses_paragraphs(self) -> bool:
    """True for hierarchical BiPE: the model needs paragraph separators (a third level)."""
    return self.rotary == 'hierarchical'

  @property
  def uses_forget_gate(self) -> bool:
    return self.bias in FOX_KINDS

  @property
  def has_bias_or_transform(self) -> bool:
    return self.bias != 'none' or self.transform != 'none'


def _bipe(name, **hooks):
  return Scheme(name, input='learned', input_stream='intra', **hooks)


_SCHEMES: Tuple[Scheme, ...] = (
    Scheme('nope'),
    Scheme('sinusoidal', input='sinusoidal', input_stream='token'),
    Scheme('learned', input='learned', input_stream='token'),
    Scheme('rope', rotary='token'),
    Scheme('alibi', bias='alibi'),
    Scheme('kerple', bias='kerple'),
    Scheme('fire', bias='fire'),
    Scheme('t5', bias='t5'),
    Scheme('fox', bias='fox'),
    Scheme('fox_bias_only', bias='fox_bias_only'),
    Scheme('fox_pro', bias='fox', fox_pro=True),  # the official Pro configuration
    Scheme('cope', transform='cope'),
    Scheme('dape_alibi', bias='alibi', transform='dape_v1'),
    Scheme('dape_kerple', bias='kerple', transform='dape_v1'),
    Scheme('dape_fire', bias='fire', transform='dape_v1'),
    Scheme('dapev2_kerple', bias='kerple', transform='dape_v2'),
    _bipe('bipe_rope', rotary='inter'),
    _bipe('bipe_alibi', bias='alibi', bias_stream='inter', alibi_slope_factor=96.0),
    _bipe('bipe_kerple', bias='kerple', bias_stream='inter'),
    _bipe('bipe_fire', bias='fire', bias_stream='inter'),
    _bipe('bipe_fox', bias='fox', bias_stream='inter'),
    _bipe('bipe_fox_bias_only', bias='fox_bias_only', bias_stream='inter'),
    _bipe('bipe_fox_pro', bias='fox', bias_stream='inter', fox_pro=True),
    _bipe('bipe_dape_kerple', bias='kerple', bias_stream='inter', transform='dape_v1'),
    _bipe('bipe3_rope', rotary='hierarchical'),  # hierarchical BiPE (docs/design.md)
)

SCHEMES: Dict[str, Scheme] = {s.name: s for s in _SCHEMES}
SCHEME_NAMES: Tuple[str, ...] = tuple(SCHEMES)


def get_scheme(name: str) -> Scheme:
  """The Scheme registered under `name`; ValueError listing the valid names otherwise."""
  if name not in SCHEMES:
    raise ValueError(f'unknown position_encoding {name!r}; valid names are: '
                     f'{", ".join(SCHEME_NAMES)}.')
  return SCHEMES[name]
