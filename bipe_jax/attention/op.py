"""The attention op: q, k, v, the mask and a description of the scheme's positional terms in,
[B, H, Q, Dh] out, through the implementation `model.attention_impl` names.

The model's attention layer (bipe_jax/model.py `Attention`) makes the projections, the rotary,
FoX Pro's parts, the KV cache, the mask and the output projection; it describes the scheme's
positional terms once, in implementation-neutral form:

  BiasTerm       the additive bias: its kind (scheme.bias), the streams it reads, its dense
                 form (a bias_fn; learned biases close over their module's parameters), those
                 parameters, and the static settings the kernels' forms need;
  TransformTerm  a score transform (DAPE, CoPE): the transform_fn, its key halo, whether only
                 dense attention runs it.

`AttentionOp` resolves the implementation ('auto' for the platform traced for; the fused and
Pallas kernels fall back to dense while decoding; a dense-only transform runs dense), refuses in
one line an implementation that does not compute the scheme (attention/support.py), forms each
implementation's arguments from the terms and calls it once (through context_parallel when the
sequence is sharded over the mesh's context axis):

  impl        the bias as                                       also
  dense       bias_fn + streams (two-sided in encoder mode)     kernels
  blockwise   the same                                          kernels, block_size, the
                                                                transform's halo, FoX's pruning
  fused       ALiBi as a per-key bias [B, H, 1, K]              plain_causal
  cudnn       (no bias)                                         plain_causal
  pallas      TileBias + params [H, P] + streams                block sizes, mesh axes, FoX's
  pallas_gpu  the same                                          pruning (pallas only)

The Pallas package is imported only when a Pallas kernel runs (it loads slowly).
"""

import dataclasses
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bipe_jax.attention import context_parallel
from bipe_jax.attention import core
from bipe_jax.attention import support
from bipe_jax.attention.mask import AttentionMask
from bipe_jax import schemes
from bipe_jax.encodings import alibi
from bipe_jax.encodings import fox
from bipe_jax.encodings import kerple
from bipe_jax.encodings import t5
from bipe_jax.encodings import two_sided

FOX_KINDS = schemes.FOX_KINDS  # c_q - c_k from forget gates
DAPE_TILE = 128  # the largest tile of the fused DAPE kernels (pallas/dape_attention.py, TPU;
# pallas/gpu_dape_attention.py, GPU, which rounds it down to its own power of two)


@dataclasses.dataclass(frozen=True)
class BiasTerm:
  """The scheme's additive bias, in the forms the implementations take.

  kind: scheme.bias ('alibi' | 'kerple' | 'fire' | 't5' | 'fox' | 'fox_bias_only').
  q_streams / k_streams: what the bias reads, [B, Q] / [B, K] (the token or inter stream); for
    FoX the cumulative log forget gates c [B, Q, H] / [B, K, H] float32 (in encoder mode the
    tuples of encodings/fox.fox_bias_two_sided).
  bias_fn: the dense form, bias_fn(q_streams, k_streams) -> [B, H, Q, K] float32, one-sided
    (causal); None for FoX (encodings/fox.py's bias of c).
  params: the bias module's parameters ('kerple': p, a [H]; 't5': rel_embedding [N, H]; none
    for ALiBi and FoX), which the Pallas kernels take as per-head rows.
  slope_factor: ALiBi's slope factor; t5_buckets / t5_max_distance: T5's bucketing;
  fox_log_pruning_tolerance: < 0 turns FoX's block / tile pruning on (encodings/fox.py).
  """
  kind: str
  q_streams: Any
  k_streams: Any
  bias_fn: Optional[core.BiasFn] = None
  params: Mapping[str, jax.Array] = dataclasses.field(default_factory=dict)
  slope_factor: float = 1.0
  t5_buckets: int = 32
  t5_max_distance: int = 128
  fox_log_pruning_tolerance: float = 0.0


@dataclasses.dataclass(frozen=True)
class TransformTerm:
  """A score transform: fn(scores, bias, q_pos, k_pos, k_in_range) -> logits (core.py's
  TransformFn); halo: the keys it needs on each side of a key block (blockwise); dense_only:
  only dense attention runs it (CoPE); kind / params: scheme.transform and the transform's
  parameters, for a kernel that computes it itself ('dape_v1': the Pallas TPU kernel of
  attention/pallas/dape_attention.py takes 'w_in', 'b_in', 'w_out', 'b_out')."""
  fn: core.TransformFn
  halo: int = 0
  dense_only: bool = False
  kind: str = ''
  params: Mapping[str, jax.Array] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AttentionOp:
  """The attention core of one layer (module docstring).

  impl: model.attention_impl ('auto' resolved for the platform traced for, with `dtype`);
  scheme: the schemes.Scheme (its bias and transform say which implementations compute it);
  block_size: blockwise's block and the Pallas kernels' tiles; kernels: model.kernels (dense and
  blockwise); decode: the layer is decoding (fused and Pallas kernels fall back to dense).
  """
  impl: str
  scheme: Any
  block_size: int = 128
  kernels: str = 'auto'
  dtype: str = 'float32'
  decode: bool = False

  def implementation(self, causal: bool = True,
                     transform: Optional[TransformTerm] = None) -> str:
    """The implementation that runs: ValueError (one line) for one that does not compute the
    scheme."""
    if (reason := support.unsupported_reason(self.impl, self.scheme)):
      raise ValueError(f'attention_impl={self.impl!r}: {reason}.')
    impl = support.resolve_attention_impl(self.impl, self.scheme, jax.default_backend(),
                                          self.dtype, causal)
    if self.decode and impl in (*support.FUSED_IMPLS, *support.TILE_BIAS_IMPLS):
      impl = 'dense'
    if transform is not None and transform.dense_only:
      impl = 'dense'
    return impl

  def arguments(self, impl: str, mask: AttentionMask, num_heads: int, head_dim: int,
                bias: Optional[BiasTerm] = None,
                transform: Optional[TransformTerm] = None) -> dict:
    """The keyword arguments of core.attention_fn(impl) (all but q, k, v)."""
    kwargs = dict(mask=mask, transform_fn=None if transform is None else transform.fn)
    if impl in support.FUSED_IMPLS:
      if bias is not None:
        if bias.kind != 'alibi':
          raise ValueError(f'attention_impl={impl!r} takes no {bias.kind!r} bias.')
        # ALiBi as a per-key bias (alibi.alibi_key_bias: equal after the softmax)
        kwargs.update(key_bias_BxHx1xK=alibi.alibi_key_bias(
            bias.k_streams, alibi.alibi_slopes(num_heads), bias.slope_factor))
      kwargs.update(plain_causal=True)  # not decoding: causal indices 0..T-1 in every row
    elif impl in support.TILE_BIAS_IMPLS:
      tile_bias, bias_params = _tile_form(bias, num_heads, head_dim, impl)
      batch_axes, head_axes = nn.logical_to_mesh_axes(('batch', 'heads'))
      kwargs.update(tile_bias=tile_bias, bias_params_HxP=bias_params, block_q=self.block_size,
                    block_k=self.block_size, batch_axes=batch_axes, head_axes=head_axes)
      if _fused_dape(impl, transform):  # the MLP mixes every head: one tile holds them all
        if not mask.causal:
          raise ValueError(f"attention_impl={impl!r} fuses DAPE for causal attention only (its "
                           "tile bias is one-sided); use 'blockwise' in encoder mode.")
        del kwargs['head_axes'], kwargs['transform_fn']
        # its tiles hold [2C + H + N, q, k] float32 arrays: 128 x 128 fits Mosaic's default
        # scoped VMEM (16 MiB on v5e) at the paper's 12 heads, 256 x 256 does not
        block = min(self.block_size, DAPE_TILE)
        kwargs.update(dape_params=transform.params, block_q=block, block_k=block)
      if bias is not None:
        kwargs.update(q_streams=bias.q_streams, k_streams=bias.k_streams)
        if (impl == 'pallas' and bias.kind in FOX_KINDS
            and bias.fox_log_pruning_tolerance < 0):  # per tile (pallas/tile_ranges.py)
          kwargs.update(fox_log_pruning_tolerance=bias.fox_log_pruning_tolerance)
    else:  # dense, blockwise: the bias as a function of the streams
      if bias is not None:
        if bias.kind in FOX_KINDS:
          bias_fn = fox.fox_bias if mask.causal else fox.fox_bias_two_sided
          if impl == 'blockwise' and bias.fox_log_pruning_tolerance < 0:
            kwargs.update(block_prune=fox.block_prune(bias.fox_log_pruning_tolerance))
        else:
          if bias.bias_fn is None:
            raise ValueError(f'attention_impl={impl!r}: the {bias.kind!r} bias has no bias_fn.')
          bias_fn = bias.bias_fn
          if not mask.causal:  # encoder mode: the same bias on the right of the query
            bias_fn = two_sided.two_sided_bias(bias_fn)
        kwargs.update(bias_fn=bias_fn, q_streams=bias.q_streams, k_streams=bias.k_streams)
      if impl == 'blockwise':
        kwargs.update(block_size=self.block_size,
                      transform_halo=0 if transform is None else transform.halo)
      kwargs.update(kernels=self.kernels)  # blockwise of one block is dense attention
    return kwargs

  def __call__(self, q_BxHxQxDh: jax.Array, k_BxGxKxDh: jax.Array, v_BxGxKxDh: jax.Array,
               mask: AttentionMask, bias: Optional[BiasTerm] = None,
               transform: Optional[TransformTerm] = None) -> jax.Array:
    """Attention [B, H, Q, Dh] of q [B, H, Q, Dh] over k, v [B, G, K, Dh] under `mask`."""
    impl = self.implementation(mask.causal, transform)
    kwargs = self.arguments(impl, mask, q_BxHxQxDh.shape[1], q_BxHxQxDh.shape[3], bias,
                            transform)
    fused_dape = _fused_dape(impl, transform)
    attend = _dape_kernel(impl) if fused_dape else core.attention_fn(impl)
    if not self.decode and context_parallel.active(q_BxHxQxDh.shape[2]):
      if fused_dape:
        raise ValueError(f"attention_impl={impl!r} with DAPE: context parallelism is not "
                         "supported (its kernel needs every head of a row); use 'blockwise'.")
      # T sharded over the context mesh axis: local queries, all-gathered keys / values.
      return context_parallel.gathered_kv_attention(attend, q_BxHxQxDh, k_BxGxKxDh,
                                                    v_BxGxKxDh, **kwargs)
    return attend(q_BxHxQxDh, k_BxGxKxDh, v_BxGxKxDh, **kwargs)


def _fused_dape(impl: str, transform: Optional[TransformTerm]) -> bool:
  """Whether `impl` runs the transform inside its kernel (DAPE V1: the TPU and GPU kernels)."""
  return (impl in support.TILE_BIAS_IMPLS and transform is not None
          and transform.kind == 'dape_v1')


def _dape_kernel(impl: str):
  """The fused DAPE kernel of `impl` ('pallas': attention/pallas/dape_attention.py, TPU;
  'pallas_gpu': gpu_dape_attention.py, Triton), imported when it runs (Pallas loads slowly)."""
  # pylint: disable=import-outside-toplevel
  if impl == 'pallas':
    from bipe_jax.attention.pallas import dape_attention
    return dape_attention.pallas_dape_attention
  from bipe_jax.attention.pallas import gpu_dape_attention
  return gpu_dape_attention.pallas_gpu_dape_attention


def _tile_form(bias: Optional[BiasTerm], num_heads: int, head_dim: int, impl: str) -> tuple:
  """(pallas.TileBias, params [H, P] float32 or None) of `bias` for the Pallas kernels: the same
  values as the bias's dense form (Kerple's clamp; T5's table scaled by sqrt(head_dim))."""
  from bipe_jax.attention import pallas  # pylint: disable=import-outside-toplevel (Pallas loads slowly)
  if bias is None:
    return pallas.TileBias('none'), None
  if bias.kind == 'alibi':
    slopes = alibi.alibi_slopes(num_heads) * bias.slope_factor
    return pallas.TileBias('alibi'), jnp.asarray(slopes, jnp.float32)[:, None]
  if bias.kind == 'kerple':
    p_a = [kerple.clamp_straight_through(bias.params[n], kerple.KERPLE_MIN)
           for n in kerple.KERPLE_PARAM_NAMES]
    return pallas.TileBias('kerple'), jnp.stack(p_a, axis=1)
  if bias.kind == 't5':
    # The kernel adds table[bucket]: the official bias weight[bucket] * sqrt(head_dim).
    table_NxH = t5.t5_table_from_weight(bias.params['rel_embedding'], t5.t5_scale(head_dim))
    return (pallas.TileBias('t5', t5_buckets=bias.t5_buckets,
                            t5_max_distance=bias.t5_max_distance), table_NxH.T)
  if bias.kind in FOX_KINDS:  # c_q - c_k from the float positions (no parameters in the kernel)
    return pallas.TileBias('fox'), jnp.zeros((num_heads, 1), jnp.float32)
  raise ValueError(f'attention_impl={impl!r} does not cover bias {bias.kind!r}.')
