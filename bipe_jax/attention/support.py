"""Which attention implementation (`model.attention_impl`) computes which scheme: one table.

dense and blockwise take any bias callback and score transform, so every scheme. The fused
kernels (`jax.nn.dot_product_attention`) take no bias callback and no transform: schemes
without a bias, and the ALiBi family as a per-key bias (encodings/alibi.alibi_key_bias). The
Pallas kernels compute the ALiBi, Kerple and T5 biases per tile and take no transform.
"""

from typing import Callable

from bipe_jax.attention.core import ATTENTION_IMPLS

_FUSED = ('the fused kernels support only encodings without bias or transform, and the ALiBi '
          'family', lambda s: s.transform == 'none' and s.bias in ('none', 'alibi'))
# impl -> (what it computes, in words; scheme -> whether it computes it)
SUPPORT: dict[str, tuple[str, Callable]] = {
    'dense': ('every scheme', lambda s: True),
    'blockwise': ('every scheme', lambda s: True),
    'fused': _FUSED,
    'cudnn': _FUSED,
    'pallas': ('the Pallas kernels compute only the ALiBi, Kerple and T5 biases (and none) per '
               'tile', lambda s: s.transform == 'none' and s.bias in ('none', 'alibi', 'kerple',
                                                                      't5')),
}


def supports(impl: str, scheme) -> bool:
  """Whether attention_impl `impl` computes `scheme` (a schemes.Scheme); False for an unknown
  implementation."""
  return impl in SUPPORT and bool(SUPPORT[impl][1](scheme))


def unsupported_reason(impl: str, scheme) -> str | None:
  """None when `impl` computes `scheme`, else one line saying what it computes instead."""
  if supports(impl, scheme):
    return None
  if impl not in SUPPORT:
    return f'attention_impl={impl!r} is not one of {ATTENTION_IMPLS}'
  return f'{SUPPORT[impl][0]}, not {scheme.name!r}; use blockwise or dense'
