"""Which attention implementation (`model.attention_impl`) computes which scheme, and what 'auto'
picks: one table. Imports nothing, so the config, the model and the per-run platform choices
(bipe_jax/platform_choices.py) can all ask it.

  impl        computes                                            runs on
  dense       every scheme                                        any platform
  blockwise   every scheme (flash-style, linear memory)           any platform
  fused       no bias and no transform, or the ALiBi family        any (XLA; cuDNN on GPU if it can)
              (as a per-key bias: encodings/alibi.alibi_key_bias)
  cudnn       no bias and no transform (cuDNN refuses a per-key   CUDA GPUs, bf16 / fp16
              bias)
  pallas      tile biases: none, ALiBi, Kerple, T5, FoX (no         TPU (Mosaic); CPU interpret
              transform); DAPE V1 on ALiBi or Kerple, fused
              (attention/pallas/dape_attention.py)
  pallas_gpu  tile biases: none, ALiBi, Kerple, T5 (no transform); CUDA GPUs (Triton); CPU interpret
              DAPE V1 on ALiBi or Kerple, fused
              (attention/pallas/gpu_dape_attention.py)

'auto' chooses by the platform of the devices the step runs on:
  TPU  'pallas' for the tile biases and DAPE V1 on ALiBi or Kerple, else 'blockwise';
  GPU  'cudnn' for schemes without bias or transform (the RoPE family, NoPE) in bf16 / fp16,
       'pallas_gpu' for the GPU kernel's tile biases (and the RoPE family in float32, which
       cuDNN's fused attention does not take), else 'blockwise' (DAPE too: its Triton kernel
       is chosen only explicitly until it is measured on a GPU);
  CPU  'blockwise'.
"""

from typing import Callable

ATTENTION_IMPLS = ('auto', 'dense', 'blockwise', 'cudnn', 'fused', 'pallas', 'pallas_gpu')
FUSED_IMPLS = ('cudnn', 'fused')  # jax.nn.dot_product_attention: no bias_fn / transform
TILE_BIAS_IMPLS = ('pallas', 'pallas_gpu')  # the bias computed per tile from a TileBias kind
TPU_TILE_BIASES = ('none', 'alibi', 'kerple', 't5', 'fox', 'fox_bias_only')
DAPE_BIASES = ('alibi', 'kerple')  # the static biases the kernels' fused DAPE V1 adapts
GPU_TILE_BIASES = ('none', 'alibi', 'kerple', 't5')
HALF_DTYPES = ('bfloat16', 'float16')


def fusable(scheme) -> bool:
  """Whether `jax.nn.dot_product_attention` runs `scheme` (no transform; no bias or ALiBi)."""
  return scheme.transform == 'none' and scheme.bias in ('none', 'alibi')


def runs_on_tiles(scheme, impl: str = 'pallas') -> bool:
  """Whether the Pallas tile-bias kernel `impl` ('pallas' | 'pallas_gpu') computes `scheme`."""
  if scheme.transform == 'dape_v1':  # the fused DAPE kernels (TPU and GPU)
    return scheme.bias in DAPE_BIASES
  biases = TPU_TILE_BIASES if impl == 'pallas' else GPU_TILE_BIASES
  return scheme.transform == 'none' and scheme.bias in biases


_TILES_WORDS = 'the Pallas kernels compute only the {} biases (and none) per tile'
# impl -> (what it computes, in words; scheme -> whether it computes it)
SUPPORT: dict[str, tuple[str, Callable]] = {
    'auto': ('every scheme (the platform\'s choice)', lambda s: True),
    'dense': ('every scheme', lambda s: True),
    'blockwise': ('every scheme', lambda s: True),
    'fused': ('the fused kernels support only encodings without bias or transform, and the '
              'ALiBi family', fusable),
    'cudnn': ('cuDNN runs only encodings without bias or transform (it refuses the ALiBi '
              'family\'s per-key bias)', lambda s: s.transform == 'none' and s.bias == 'none'),
    'pallas': (_TILES_WORDS.format('ALiBi, Kerple, T5 and FoX') + ', and DAPE V1 on ALiBi '
               'or Kerple',
               lambda s: runs_on_tiles(s, 'pallas')),
    'pallas_gpu': (_TILES_WORDS.format('ALiBi, Kerple and T5') + ', and DAPE V1 on ALiBi or '
                   'Kerple',
                   lambda s: runs_on_tiles(s, 'pallas_gpu')),
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


def resolve_attention_impl(impl: str, scheme, platform: str, dtype: str = 'float32',
                           causal: bool = True) -> str:
  """`impl` with 'auto' replaced by the choice for `scheme` on `platform` ('cpu', 'tpu', 'gpu',
  'cuda', ...) computing in `dtype`; any other value is returned as it is. An encoder
  (`causal=False`) with a bias runs blockwise: its biases are made two-sided per block
  (encodings/two_sided.py), which the kernels do not do."""
  if impl != 'auto':
    return impl
  if not causal and scheme.bias != 'none':
    return 'blockwise'
  if platform == 'tpu':
    return 'pallas' if runs_on_tiles(scheme, 'pallas') else 'blockwise'
  if platform in ('gpu', 'cuda'):
    if scheme.transform == 'none' and scheme.bias == 'none' and dtype in HALF_DTYPES:
      return 'cudnn'
    # the Triton DAPE kernel is explicit only (attention_impl='pallas_gpu'): not yet compiled
    # on a GPU, and Triton was still compiling it at the 151M shape after 7 minutes here
    fused = runs_on_tiles(scheme, 'pallas_gpu') and scheme.transform == 'none'
    return 'pallas_gpu' if fused else 'blockwise'
  return 'blockwise'
