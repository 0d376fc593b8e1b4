"""Which attention implementation runs which scheme, and what `attention_impl='auto'` picks.

  impl        runs                                               on
  dense       every scheme                                       any platform
  blockwise   every scheme (flash-style, linear memory)          any platform
  fused       no bias and no transform, or the ALiBi family      any (XLA; cuDNN on GPU if it can)
  cudnn       the same, forced to cuDNN                          CUDA GPUs, bf16 / fp16
  pallas      tile biases: none, ALiBi, Kerple, T5 (no transform) TPU (Mosaic); CPU interpret
  pallas_gpu  the same tile biases                               CUDA GPUs (Triton); CPU interpret

'auto' chooses by the platform of the devices the step runs on:
  TPU       'pallas' for the tile biases, else 'blockwise';
  GPU       'cudnn' for schemes without bias or transform (the RoPE family, NoPE) in bf16 / fp16,
            'pallas_gpu' for the tile biases (and for the RoPE family in float32, which cuDNN's
            fused attention does not take), else 'blockwise';
  CPU       'blockwise'.
This module imports nothing of the model, so the config, the kernels seam and the model can all
ask it.
"""

ATTENTION_IMPLS = ('auto', 'dense', 'blockwise', 'cudnn', 'fused', 'pallas', 'pallas_gpu')
FUSED_IMPLS = ('cudnn', 'fused')  # jax.nn.dot_product_attention: no bias_fn / transform
TILE_BIAS_IMPLS = ('pallas', 'pallas_gpu')  # the bias computed per tile from a TileBias kind
TILE_BIASES = ('none', 'alibi', 'kerple', 't5')
HALF_DTYPES = ('bfloat16', 'float16')


def runs_on_tiles(scheme) -> bool:
  """Whether the Pallas tile-bias kernels compute `scheme` (a schemes.Scheme)."""
  return scheme.transform == 'none' and scheme.bias in TILE_BIASES


def fusable(scheme) -> bool:
  """Whether `jax.nn.dot_product_attention` runs `scheme` (no transform; no bias or ALiBi)."""
  return scheme.transform == 'none' and scheme.bias in ('none', 'alibi')


def resolve_attention_impl(impl: str, scheme, platform: str, dtype: str = 'float32') -> str:
  """`impl` with 'auto' replaced by the choice for `scheme` on `platform` ('cpu', 'tpu', 'gpu',
  'cuda', ...) computing in `dtype`; any other value is returned as it is."""
  if impl != 'auto':
    return impl
  if platform == 'tpu':
    return 'pallas' if runs_on_tiles(scheme) else 'blockwise'
  if platform in ('gpu', 'cuda'):
    if scheme.transform == 'none' and scheme.bias == 'none' and dtype in HALF_DTYPES:
      return 'cudnn'
    return 'pallas_gpu' if runs_on_tiles(scheme) else 'blockwise'
  return 'blockwise'
