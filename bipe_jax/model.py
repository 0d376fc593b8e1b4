"""Llama-style decoder Transformer with every positional scheme of the registry.

RMSNorm, SwiGLU MLP, grouped-query attention, untied embeddings, no biases in linear layers.
The positional scheme (bipe_jax.schemes.Scheme) says which position stream feeds which hook:
  input      token embeddings + sinusoidal / learned table of the token or intra stream,
  rotary     RoPE on q and k by the token or inter stream (with PI / NTK / YaRN scaling),
  bias       ALiBi / Kerple / FIRE / T5 bias from the token or inter stream, per attention block,
  transform  DAPE V1 / V2 on (scores, bias) of all heads, per attention block.

Parameter tree (docs/design.md; the checkpoint converter relies on these names):
  embed/embedding [V, D], intra_embed/embedding [max_intra, D], abs_embed/embedding [max_pos, D]
  (max_pos = model.randomized_positions when set),
  layer_{i}/{attention_norm,mlp_norm}/scale [D],
  layer_{i}/attention/{query,key,value}/kernel [D, H|G, Dh], layer_{i}/attention/out/kernel
  [H, Dh, D], layer_{i}/attention/{kerple,fire,t5,dape}/..., layer_{i}/mlp/{gate,up}/kernel
  [D, F], layer_{i}/mlp/down/kernel [F, D], final_norm/scale [D], lm_head/kernel [D, V].
  With `scan_layers` the layers are one `nn.scan` named 'layers': layers/... holds the same
  leaves with a leading [num_layers] axis (`stack_layer_params` / `unstack_layer_params`
  convert; `init_from` and the Hugging Face converter accept either layout).

Decoding (`decode=True`, collection 'cache'). Create the cache with
  `model.init(rng, jnp.zeros((B, max_len), jnp.int32), decode=True)['cache']`
and then call `model.apply({'params': p, 'cache': c}, chunk_BxN, decode=True,
mutable=['cache'])` with a prompt (prefill) or one token at a time. The cache holds, per layer,
the keys (after RoPE) and values of every slot; at the top level the token ids of every slot,
the position streams of every slot (so biases see all cached keys), the fill index, and the
running bilevel state of the last valid token (inter, intra, separator flag, document). The
streams are recomputed from the token ids with `bilevel_positions` over the whole buffer on each
call (O(max_len) integer work, negligible next to attention), which makes the positions of a
new token continue the prompt exactly as in a full forward pass (a token after a separator
starts a new segment; padding is invisible). Passing `positions` with decode=True stores the
given streams for the chunk instead.
Padding without a pad id: `valid_BxT` (bool [B, T], False = padding) marks tokens that take no
position and that no query sees, in a full forward pass and in decode (where the cache keeps
the mask of every slot): a batch of prompts of different lengths is left-padded with any id.
The caller keeps the total number of decoded tokens <= max_len (the fill index is traced, so an
overflow cannot be detected inside jit; writes past the end would be clamped).
DAPE V2 note: a convolution over keys with 'same' padding sees the sequence end; in decode the
end is the cache length max_len, so decoded logits equal a full forward over max_len tokens.
"""

import dataclasses
import functools
import math
from typing import Any, Callable, Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from bipe_jax import attention as attention_lib
from bipe_jax import input_checks
from bipe_jax.attention import context_parallel
from bipe_jax.attention import op as attention_op
from bipe_jax import kernels as kernels_lib
from bipe_jax import positions as positions_lib
from bipe_jax import remat as remat_lib
from bipe_jax.config import ModelConfig
from bipe_jax.encodings import absolute
from bipe_jax.encodings import alibi
from bipe_jax.encodings import cope
from bipe_jax.encodings import dape
from bipe_jax.encodings import fire
from bipe_jax.encodings import fox
from bipe_jax.encodings import fox_pro
from bipe_jax.encodings import hierarchical
from bipe_jax.encodings import initializers
from bipe_jax.encodings import kerple
from bipe_jax.encodings import randomized
from bipe_jax.encodings import recipes
from bipe_jax.encodings import rope
from bipe_jax.encodings import t5

_INIT = nn.initializers.normal(stddev=0.02)  # Llama initializer_range


@flax.struct.dataclass
class Side:
  """Positions of one side (queries or keys) of attention; every field is [B, N]."""
  index: jax.Array  # causal index: position in the row, or cache slot
  token: jax.Array
  intra: jax.Array
  inter: jax.Array
  document: jax.Array
  valid: jax.Array  # bool
  paragraph: jax.Array  # hierarchical BiPE: paragraph index (positions.py)
  sentence: jax.Array  # hierarchical BiPE: segment index inside the paragraph
  # RoPE tables of the query side, [B, 1, N, Dh] float32, made once per forward pass by the
  # Transformer (None: each attention computes its own).
  rope_cos: Optional[jax.Array] = None
  rope_sin: Optional[jax.Array] = None

  @classmethod
  def from_positions(cls, pos: positions_lib.BilevelPositions, index_BxN: jax.Array) -> 'Side':
    return cls(index=index_BxN, token=pos.token, intra=pos.intra, inter=pos.inter,
               document=pos.document, valid=pos.valid, paragraph=_stream(pos, 'paragraph'),
               sentence=_stream(pos, 'sentence'))

  def stream(self, name: str) -> jax.Array:
    return getattr(self, name)


def _stream(pos: positions_lib.BilevelPositions, name: str) -> jax.Array:
  """A stream of `pos`; the hierarchy's streams given as None mean one paragraph
  (paragraph 0, sentence = inter), as positions.py computes without paragraph separators."""
  value = getattr(pos, name)
  if value is None:
    value = pos.inter if name == 'sentence' else jnp.zeros_like(pos.inter)
  return value


def rotary_tables(cfg: ModelConfig, side: 'Side',
                  num_positions: Optional[int] = None) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) [B, 1, N, Dh] of the scheme's rotary for the positions of `side`: one stream,
  or hierarchical BiPE's sentence and paragraph streams on alternate frequencies."""
  rotary = cfg.scheme.rotary
  if rotary == 'hierarchical':
    return hierarchical.mix_rotary_tables(rope_tables(cfg, side.sentence, num_positions),
                                          rope_tables(cfg, side.paragraph, num_positions))
  return rope_tables(cfg, side.stream(rotary), num_positions)


def rope_tables(cfg: ModelConfig, positions_BxT: jax.Array,
                num_positions: Optional[int] = None) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) [B, 1, T, Dh] of the config's RoPE (base, scaling) at `positions`, as the
  config's kernels path makes them once per forward pass (bipe_jax.kernels: computed in the
  program, or on CPU read from host tables up to a bound).

  `num_positions`: a bound the caller guarantees (every position in [0, num_positions)).
  """
  inv_freq = rope.rope_inv_frequencies(cfg.head_size, cfg.rope_base, cfg.rope_scaling,
                                       cfg.rope_scaling_factor, cfg.rope_original_length)
  inv_freq = recipes.partial_rotary_frequencies(inv_freq, cfg.rope_fraction)
  mscale = rope.rope_attention_scale(cfg.rope_scaling, cfg.rope_scaling_factor)
  return kernels_lib.select(cfg.kernels).rope_cos_sin(positions_BxT, inv_freq, mscale,
                                                      num_positions)


class RMSNorm(nn.Module):
  """x / rms(x) * scale, statistics in float32; param 'scale' [D] (init 1)."""
  eps: float = 1e-5
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    scale = self.param('scale',
                       initializers.logically_partitioned(nn.initializers.ones, ('embed',)),
                       (x_BxTxD.shape[-1],), jnp.float32)
    x = x_BxTxD.astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    return (y * scale).astype(self.dtype)


class Projection(nn.Module):
  """A bias-free linear map given by an einsum equation, computed by the `kernels` path's
  `project` (bipe_jax.kernels); param 'kernel' of `shape` (float32)."""
  shape: tuple
  axes: tuple
  equation: str
  dtype: Any = jnp.float32
  kernels: str = 'auto'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param('kernel', initializers.logically_partitioned(_INIT, self.axes),
                        self.shape, jnp.float32)
    path = kernels_lib.select(self.kernels)
    if context_parallel.context_size() > 1:
      # The cpu path's 2-D form merges the batch and sequence axes, which a context-sharded
      # sequence cannot be merged into without gathering it: the einsum keeps them apart.
      path = kernels_lib.select('portable')
    y = path.project(self.equation, x.astype(self.dtype), kernel.astype(self.dtype))
    return checkpoint_name(y, self.name)  # for model.remat's policies


def _module_params(make_module: Callable[..., nn.Module], name: str, *example_args) -> dict:
  """Creates `make_module(name=name)`'s params in the current scope (by one call on tiny
  `example_args`) and returns them."""
  bound = make_module(name=name)
  bound(*example_args)
  return bound.variables.get('params', {})


def _pure(make_module: Callable[..., nn.Module], name: str, *example_args) -> Callable:
  """Creates `make_module(name=name)`'s params in the current scope and returns a pure function
  with those params closed over.

  Linen modules cannot be called inside `lax.scan` (the blockwise attention loop); the returned
  function applies an unbound copy with explicit params, which can.
  """
  return _pure_and_params(make_module, name, *example_args)[0]


def _pure_and_params(make_module: Callable[..., nn.Module], name: str,
                     *example_args) -> tuple[Callable, dict]:
  """`_pure`'s function and the params it closes over."""
  params = _module_params(make_module, name, *example_args)
  unbound = make_module(parent=None)
  return (lambda *args: unbound.apply({'params': params}, *args)), params


class Attention(nn.Module):
  """Multi-head / grouped-query self-attention with the scheme's rotary, bias and transform.

  The layer makes the projections, the rotary, FoX Pro's parts, the KV cache, the mask and the
  output projection, and describes the scheme's bias and transform (attention/op.py's BiasTerm,
  TransformTerm); the op picks the implementation and forms its arguments."""
  config: ModelConfig
  decode: bool = False
  mask_keys: bool = False  # mask invalid keys (Side.valid) even without a pad_id

  def _bias_fn_and_params(self) -> tuple[Optional[Callable], dict]:
    """(bias_fn, params) of the scheme's bias: its dense form bias_fn(q_streams, k_streams) ->
    [B, H, Q, K] float32 (one-sided: attention/op.py makes it two-sided in encoder mode) and
    the parameters of its module, created in this scope (none for ALiBi); (None, {}) without
    a bias or for FoX (its bias is formed from the forget-gate streams)."""
    cfg, s = self.config, self.config.scheme
    h = cfg.num_heads
    pos1 = jnp.zeros((1, 1), jnp.int32)
    if s.bias == 'alibi':
      slopes = alibi.alibi_slopes(h)
      fn = functools.partial(alibi.alibi_bias, slopes_H=slopes, slope_factor=cfg.slope_factor)
      return fn, {}
    if s.bias == 'kerple':
      return _pure_and_params(functools.partial(kerple.KerpleLogBias, h), 'kerple', pos1, pos1)
    if s.bias == 'fire':
      slope = dape.LEAKY_SLOPE if s.transform != 'none' else 0.0  # official DAPE: LeakyReLU
      make = functools.partial(fire.FireBias, h, hidden=cfg.fire_hidden,
                               init_L=float(cfg.fire_L0), negative_slope=slope)
      return _pure_and_params(make, 'fire', pos1, pos1)
    if s.bias == 't5':
      make = functools.partial(t5.T5RelativeBias, h, num_buckets=cfg.t5_buckets,
                               max_distance=cfg.t5_max_distance,
                               scale=t5.t5_scale(cfg.head_size))
      return _pure_and_params(make, 't5', pos1, pos1)
    return None, {}

  def _bias_fn(self) -> Optional[Callable]:
    """The dense form of the scheme's bias (`_bias_fn_and_params`), or None."""
    return self._bias_fn_and_params()[0]

  def _bias_term(self, x_BxTxD: jax.Array, q_side: Side, k_side: Side,
                 cache_index: jax.Array) -> Optional[attention_op.BiasTerm]:
    """The scheme's bias for the attention op (attention/op.py), or None without one."""
    cfg, s = self.config, self.config.scheme
    if s.bias == 'none':
      return None
    if s.uses_forget_gate:
      c_q, c_k = self._forget_gate_streams(x_BxTxD, q_side, k_side, cache_index)
      return attention_op.BiasTerm(
          s.bias, c_q, c_k, fox_log_pruning_tolerance=cfg.fox_log_pruning_tolerance)
    bias_fn, params = self._bias_fn_and_params()
    return attention_op.BiasTerm(
        s.bias, q_side.stream(s.bias_stream), k_side.stream(s.bias_stream), bias_fn=bias_fn,
        params=params, slope_factor=cfg.slope_factor, t5_buckets=cfg.t5_buckets,
        t5_max_distance=cfg.t5_max_distance)

  def _forget_gate_streams(self, x_BxTxD: jax.Array, q_side: Side, k_side: Side,
                           cache_index: jax.Array) -> tuple:
    """FoX's cumulative log forget gates (c of the queries [B, Q, H], c of the keys [B, K, H],
    float32; encodings/fox.py; in encoder mode the streams of fox.fox_bias_two_sided).
    Decoding keeps c of every cache slot ('fox_c'), so a chunk continues from the c of the slot
    before it; with a context axis, c is a prefix sum carried across the shards."""
    cfg, s = self.config, self.config.scheme
    t = x_BxTxD.shape[1]
    if cfg.fox_gate == 'fixed':  # constant gates (encodings/fox_pro.py): no parameters
      log_f = fox_pro.fixed_log_gates(cfg.num_heads, cfg.fox_decay_time_min,
                                      cfg.fox_decay_time_max, x_BxTxD.shape[0], t)
    else:
      log_f = fox.ForgetGate(cfg.num_heads, data_dependent=s.bias == 'fox',
                             name='forget_gate')(x_BxTxD)
    starts = None
    if s.bias_stream == 'inter':  # bilevel: gates only at the first token of each segment
      starts = fox.segment_starts(q_side.intra, q_side.inter, q_side.valid)
    log_f = fox.masked_log_gates(log_f, q_side.valid, starts)
    if self.decode:
      initialized = self.has_variable('cache', 'fox_c')
      cached = self.variable('cache', 'fox_c', jnp.zeros, log_f.shape, jnp.float32)
      if initialized:
        before = jax.lax.dynamic_index_in_dim(cached.value, jnp.maximum(cache_index - 1, 0),
                                              axis=1, keepdims=False)
        c_q = fox.cumulative_log_gates(log_f, jnp.where(cache_index > 0, before, 0.0))
        cached.value = jax.lax.dynamic_update_slice(cached.value, c_q, (0, cache_index, 0))
        return c_q, cached.value
    if context_parallel.active(t):
      c = context_parallel.global_cumsum(log_f)
    else:
      c = fox.cumulative_log_gates(log_f)
    if not cfg.causal:  # encoder mode: fox.fox_bias_two_sided's streams
      return (c, q_side.index), (c, log_f, k_side.index)
    return c, c

  def _shifted_kv(self, x_BxTxD: jax.Array, k_BxGxTxDh: jax.Array, v_BxGxTxDh: jax.Array,
                  q_side: Side, cache_index: jax.Array) -> tuple:
    """FoX Pro's key / value shift (encodings/fox_pro.py) of k and v [B, G, T, Dh]. Decoding
    keeps each row's last masked k' and v' ('shift_key', 'shift_value' [B, G, Dh]), so a chunk
    continues from the token before it."""
    cfg = self.config
    if context_parallel.active(k_BxGxTxDh.shape[2]) and not self.decode:
      raise ValueError(f'{cfg.position_encoding}: context parallelism is not supported (the '
                       'key / value shift reads the previous token across the shard boundary).')
    keep = q_side.valid
    continues = jnp.ones_like(keep)
    if cfg.mask_across_documents:  # no shift across a document start
      continues = continues.at[:, 1:].set(q_side.document[:, 1:] == q_side.document[:, :-1])
    shifted = []
    for name, x in (('key', k_BxGxTxDh), ('value', v_BxGxTxDh)):
      alpha = fox_pro.ShiftGate(cfg.kv_heads, name=f'{name}_shift')(x_BxTxD)
      before = None
      if self.decode:
        initialized = self.has_variable('cache', f'shift_{name}')
        last = self.variable('cache', f'shift_{name}', jnp.zeros,
                             (x.shape[0], x.shape[1], x.shape[3]), x.dtype)
        if initialized:
          before = jnp.where(cache_index > 0, last.value, jnp.zeros_like(last.value))
          last.value = jnp.where(keep[:, -1, None, None], x[:, :, -1], 0).astype(x.dtype)
      shifted.append(fox_pro.token_shift(x, alpha, keep, continues, before))
    return tuple(shifted)

  def _transform(self) -> Optional[attention_op.TransformTerm]:
    """The scheme's DAPE transform (its function of (scores, bias, q_pos, k_pos, k_in_range),
    halo and parameters), or None."""
    cfg, s = self.config, self.config.scheme
    h = cfg.num_heads
    s1 = jnp.zeros((1, h, 1, 1), jnp.float32)
    pos1 = jnp.zeros((1, 1), jnp.int32)
    if s.transform == 'dape_v1':
      fn, params = _pure_and_params(functools.partial(dape.DapeV1, h, hidden=cfg.dape_hidden),
                                    'dape', s1, s1)
      return attention_op.TransformTerm(
          lambda scores, bias, q_pos, k_pos, k_in_range: fn(scores, bias), kind=s.transform,
          params=params)
    if s.transform == 'dape_v2':
      make = functools.partial(dape.DapeV2, h, hidden=cfg.dape_hidden,
                               kernel_size=cfg.dapev2_kernel)
      fn = _pure(make, 'dape', s1, s1, pos1, pos1, jnp.ones((1, 1), bool))
      return attention_op.TransformTerm(fn, dape.dapev2_halo(cfg.dapev2_kernel),
                                        kind=s.transform)
    return None

  def _fused_rotary(self) -> bool:
    """Whether the rotary runs as `rope.rotate_fused` (the same values in one pass that XLA
    fuses: issue 53): when the Pallas TPU kernel attends (its q / k are read once more in the
    kernel's [B, H, Dh, T] layout, which XLA writes straight from the fused pass)."""
    if self.decode:
      return False
    op = attention_op.AttentionOp(self.config.attention_impl, self.config.scheme,
                                  dtype=self.config.dtype)
    return op.implementation(self.config.causal) == 'pallas'

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, q_side: Side, k_side: Side,
               cache_index: jax.Array) -> jax.Array:
    cfg, scheme = self.config, self.config.scheme
    h, g, dh, d = cfg.num_heads, cfg.kv_heads, cfg.head_size, cfg.hidden_size
    dtype = cfg.compute_dtype
    proj = lambda n, shape, axes, eq: Projection(shape, axes, eq, dtype, cfg.kernels, name=n)
    q = proj('query', (d, h, dh), ('embed', 'heads', 'head_dim'), 'btd,dhk->bhtk')(x_BxTxD)
    k = proj('key', (d, g, dh), ('embed', 'kv_heads', 'head_dim'), 'btd,dgk->bgtk')(x_BxTxD)
    v = proj('value', (d, g, dh), ('embed', 'kv_heads', 'head_dim'), 'btd,dgk->bgtk')(x_BxTxD)
    if scheme.fox_pro:  # key / value shift, then QK-norm (encodings/fox_pro.py)
      k, v = self._shifted_kv(x_BxTxD, k, v, q_side, cache_index)
      q = fox_pro.HeadNorm(h, fox_pro.QK_NORM_EPS, name='q_norm')(q)
      k = fox_pro.HeadNorm(g, fox_pro.QK_NORM_EPS, name='k_norm')(k)
    if cfg.query_log_scale:  # recipes.py: log-length scaling past the training length
      q = q * rope.rope_log_scale(q_side.token, cfg.train_length,
                                  min_scale=1.0)[:, None, :, None].astype(q.dtype)

    if scheme.rotary != 'none':
      if cfg.rope_log_scale:  # config.py: not with the hierarchical rotary
        rot_pos = q_side.stream(scheme.rotary)
        q = q * rope.rope_log_scale(rot_pos, cfg.train_length)[:, None, :, None].astype(q.dtype)
      cos, sin = q_side.rope_cos, q_side.rope_sin
      if cos is None:  # an Attention used without the Transformer's tables
        cos, sin = rotary_tables(cfg, q_side)
      if self._fused_rotary():
        # Tagged like the projections (remat.py's save_projections): the backward then keeps
        # the rotated q and k, which the kernel's backward reads, in place of the
        # projections' outputs (as many bytes), and does not rotate them again.
        q = checkpoint_name(rope.rotate_fused(q, cos, sin), 'query')
        k = checkpoint_name(rope.rotate_fused(k, cos, sin), 'key')
      else:
        q, k = rope.rotate(q, cos, sin), rope.rotate(k, cos, sin)

    if self.decode:
      initialized = self.has_variable('cache', 'cached_key')
      cached_k = self.variable('cache', 'cached_key', jnp.zeros, k.shape, k.dtype)
      cached_v = self.variable('cache', 'cached_value', jnp.zeros, v.shape, v.dtype)
      if initialized:
        at = (0, 0, cache_index, 0)
        cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, at)
        cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, at)
        k, v = cached_k.value, cached_v.value

    transform = self._transform()
    if scheme.transform == 'cope':  # dense only (encodings/cope.py)
      if context_parallel.active(q.shape[2]) and not self.decode:
        raise ValueError('cope: context parallelism is not supported (CoPE runs densely).')
      cope.check_length(k.shape[2])
      qe = cope.CopeEmbedding(cfg.cope_positions, name='cope')(q)
      qe_right = (None if cfg.causal else  # encoder mode: keys on the right read their own table
                  cope.CopeEmbedding(cfg.cope_positions, name='cope_right')(q))
      transform = attention_op.TransformTerm(
          cope.cope_transform(qe, 1.0 / math.sqrt(dh), qe_right), dense_only=True)
    if not cfg.causal and self.decode:  # encoder mode (config validation refuses the rest)
      raise ValueError('model.causal=False (encoder mode) cannot decode: use a full forward.')
    documents = cfg.mask_across_documents
    mask = attention_lib.AttentionMask(
        q_pos=q_side.index, k_pos=k_side.index,
        k_valid=k_side.valid if cfg.pad_id >= 0 or self.mask_keys else None,
        q_document=q_side.document if documents else None,
        k_document=k_side.document if documents else None, causal=cfg.causal)
    # the op picks the implementation ('auto': the platform traced for) and forms its arguments
    op = attention_op.AttentionOp(cfg.attention_impl, scheme, block_size=cfg.block_size,
                                  kernels=cfg.kernels, dtype=cfg.dtype, decode=self.decode)
    out_BxHxTxDh = op(q, k, v, mask, self._bias_term(x_BxTxD, q_side, k_side, cache_index),
                      transform)
    out_BxHxTxDh = nn.with_logical_constraint(out_BxHxTxDh,
                                              ('batch', 'heads', 'length', 'head_dim'))
    if scheme.fox_pro:  # the gated output norm (encodings/fox_pro.py)
      out_BxHxTxDh = fox_pro.GatedOutputNorm(h, name='output_gate')(out_BxHxTxDh, x_BxTxD)
    return proj('out', (h, dh, d), ('heads', 'head_dim', 'embed'), 'bhtk,hkd->btd')(out_BxHxTxDh)


class Mlp(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    cfg = self.config
    d, f, dtype, kern = cfg.hidden_size, cfg.ffn_size, cfg.compute_dtype, cfg.kernels
    gate = Projection((d, f), ('embed', 'mlp'), 'btd,df->btf', dtype, kern, name='gate')(x_BxTxD)
    up = Projection((d, f), ('embed', 'mlp'), 'btd,df->btf', dtype, kern, name='up')(x_BxTxD)
    swiglu = kernels_lib.select(kern).swiglu
    hidden_BxTxF = nn.with_logical_constraint(swiglu(gate, up), ('batch', 'length', 'mlp'))
    return Projection((f, d), ('mlp', 'embed'), 'btf,fd->btd', dtype, kern,
                      name='down')(hidden_BxTxF)


class DecoderLayer(nn.Module):
  """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""
  config: ModelConfig
  decode: bool = False
  mask_keys: bool = False

  @nn.compact
  def __call__(self, x_BxTxD, q_side: Side, k_side: Side, cache_index):
    cfg = self.config
    norm = lambda name: RMSNorm(cfg.rms_eps, cfg.compute_dtype, name=name)
    x = x_BxTxD + Attention(cfg, self.decode, self.mask_keys, name='attention')(
        norm('attention_norm')(x_BxTxD), q_side, k_side, cache_index)
    x = x + Mlp(cfg, name='mlp')(norm('mlp_norm')(x))
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))


class ScannedDecoderLayer(DecoderLayer):
  """DecoderLayer as the body of `nn.scan`: (x, ...) -> (x, None)."""

  @nn.compact
  def __call__(self, x_BxTxD, q_side: Side, k_side: Side, cache_index):
    return super().__call__(x_BxTxD, q_side, k_side, cache_index), None


SCANNED_LAYERS = 'layers'


def stack_layer_params(params: dict, num_layers: int) -> dict:
  """Unrolled parameters (layer_0 .. layer_{L-1}) -> the scanned layout ('layers', every leaf
  with a leading [L] axis). Other entries are kept (unboxed: plain arrays); the inverse of
  `unstack_layer_params`."""
  params = nn.meta.unbox(params)  # plain arrays: a logical-axis box would keep its old names
  names = [f'layer_{i}' for i in range(num_layers)]
  missing = [n for n in names if n not in params]
  if missing or SCANNED_LAYERS in params:
    raise ValueError(f'stack_layer_params: expected {names[0]}..{names[-1]} and no '
                     f'{SCANNED_LAYERS!r}; missing {missing}')
  out = {k: v for k, v in params.items() if k not in names}
  out[SCANNED_LAYERS] = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[n] for n in names])
  return out


def unstack_layer_params(params: dict) -> dict:
  """The scanned layout ('layers', leading [L] axis) -> layer_0 .. layer_{L-1}."""
  if SCANNED_LAYERS not in params:
    raise ValueError(f'unstack_layer_params: no {SCANNED_LAYERS!r} entry (already unrolled?)')
  params = nn.meta.unbox(params)
  stacked = params[SCANNED_LAYERS]
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  out = {k: v for k, v in params.items() if k != SCANNED_LAYERS}
  for i in range(num_layers):
    out[f'layer_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return out


def match_layer_layout(params: dict, like: dict) -> dict:
  """`params` in the layer layout of `like` (stacked or unrolled), converting if needed."""
  if SCANNED_LAYERS in like and SCANNED_LAYERS not in params and 'layer_0' in params:
    return stack_layer_params(params, jax.tree.leaves(like[SCANNED_LAYERS])[0].shape[0])
  if SCANNED_LAYERS in params and SCANNED_LAYERS not in like and 'layer_0' in like:
    return unstack_layer_params(params)
  return params


def input_positions(cfg: ModelConfig, side: Side) -> jax.Array:
  """The scheme's input position embedding [B, T, D] (compute dtype) of `side`'s input stream:
  sinusoidal, or a learned table ('intra_embed' / 'abs_embed', made in the calling module's
  scope: call it inside a compact method). Not for schemes whose input is 'none'."""
  scheme, dtype = cfg.scheme, cfg.compute_dtype
  stream = side.stream(scheme.input_stream)
  if scheme.input == 'sinusoidal':
    return absolute.sinusoidal_embedding(stream, cfg.hidden_size).astype(dtype)
  if scheme.uses_learned_intra:
    return absolute.LearnedPositionEmbedding(
        cfg.max_intra, cfg.hidden_size, zero_last_row=cfg.intra_zero_last_row, dtype=dtype,
        name='intra_embed')(stream)
  return absolute.LearnedPositionEmbedding(
      cfg.position_table_size, cfg.hidden_size, dtype=dtype, name='abs_embed')(stream)


def randomize_positions(cfg: ModelConfig, pos: positions_lib.BilevelPositions,
                        key: jax.Array) -> positions_lib.BilevelPositions:
  """`pos` [B, T] with the streams cfg's scheme reads drawn as ordered random subsets of
  0..cfg.randomized_positions-1 from `key` (encodings/randomized.py; intra and sentence kept)."""
  if context_parallel.active(pos.token.shape[1]):
    raise ValueError('model.randomized_positions: not supported with a context mesh axis '
                     '(each row draws its positions whole).')
  return randomized.randomize_positions(pos, key, cfg.randomized_positions,
                                        randomized.scheme_streams(cfg.scheme),
                                        cfg.restart_at_documents)


class Transformer(nn.Module):
  """Decoder-only language model; __call__(tokens [B, T]) -> logits [B, T, V] float32.

  Token ids must lie in [0, vocab_size): an eager call raises ValueError otherwise; inside
  jax.jit nothing is checked (no per-step cost) and every logit of that token's row is NaN.
  """
  config: ModelConfig

  def _tables(self):
    cfg = self.config
    sep = positions_lib.separator_table(cfg.vocab_size, cfg.separator_ids)
    docs = None
    if cfg.bos_id >= 0:
      docs = positions_lib.separator_table(cfg.vocab_size, (cfg.bos_id,))
    return sep, docs

  def _paragraph_table(self):
    """[V] bool of the paragraph separators (hierarchical schemes with ids), else None."""
    cfg = self.config
    if not (cfg.scheme.uses_paragraphs and cfg.paragraph_ids):
      return None
    return positions_lib.separator_table(cfg.vocab_size, cfg.paragraph_ids)

  def compute_positions(self, tokens_BxT: jax.Array,
                        valid_BxT: Optional[jax.Array] = None) -> positions_lib.BilevelPositions:
    """The position streams the model derives from token ids (config separators, BOS, pad) and
    the optional validity mask [B, T] (False = padding)."""
    cfg = self.config
    sep, docs = self._tables()
    # With T sharded over a context mesh axis, each shard computes its own slice (equal).
    compute = (context_parallel.global_positions if context_parallel.active(tokens_BxT.shape[1])
               else positions_lib.bilevel_positions)
    return compute(
        tokens_BxT, sep, document_start_table_V=docs,
        pad_id=cfg.pad_id if cfg.pad_id >= 0 else None,
        restart_at_documents=cfg.restart_at_documents, valid_BxT=valid_BxT,
        paragraph_table_V=self._paragraph_table(),
        fixed_segment_length=cfg.fixed_segment_length)

  def _decode_sides(self, tokens_BxT, positions, valid_BxT):
    """Updates the top-level cache; returns (q_side, k_side, cache_index) for this chunk."""
    b, t = tokens_BxT.shape
    initialized = self.has_variable('cache', 'index')
    index = self.variable('cache', 'index', lambda: jnp.zeros((), jnp.int32))
    buf = self.variable('cache', 'tokens', jnp.zeros, (b, t), jnp.int32)
    streams = ('token', 'intra', 'inter', 'document', 'paragraph', 'sentence')
    cached = {n: self.variable('cache', f'pos_{n}', jnp.zeros, (b, t), jnp.int32)
              for n in streams}
    cached_valid = self.variable('cache', 'pos_valid', jnp.zeros, (b, t), bool)
    padding = self.variable('cache', 'padding', jnp.zeros, (b, t), bool)  # True: not a token
    state = {n: self.variable('cache', f'last_{n}', jnp.zeros, (b,), jnp.int32)
             for n in ('intra', 'inter', 'document')}
    last_sep = self.variable('cache', 'last_is_separator', jnp.zeros, (b,), bool)
    if not initialized:  # model.init(decode=True): create the cache, run a normal forward.
      return None
    start = index.value
    max_len = buf.value.shape[1]
    if t > max_len:
      raise ValueError(f'decode: a chunk of {t} tokens does not fit the cache of {max_len} '
                       f'slots; initialise the cache with a longer [B, max_len] batch.')
    buf.value = jax.lax.dynamic_update_slice(buf.value, tokens_BxT.astype(jnp.int32),
                                             (0, start))
    if valid_BxT is not None:
      padding.value = jax.lax.dynamic_update_slice(
          padding.value, ~jnp.asarray(valid_BxT, bool), (0, start))
    if positions is None:
      full = self.compute_positions(buf.value, ~padding.value)
      for n in streams:
        cached[n].value = getattr(full, n)
      cached_valid.value = full.valid
    else:
      for n in streams:
        cached[n].value = jax.lax.dynamic_update_slice(
            cached[n].value, _stream(positions, n).astype(jnp.int32), (0, start))
      cached_valid.value = jax.lax.dynamic_update_slice(cached_valid.value, positions.valid,
                                                        (0, start))
    slot_BxL = jnp.broadcast_to(jnp.arange(max_len, dtype=jnp.int32), (b, max_len))
    k_side = Side(index=slot_BxL, token=cached['token'].value, intra=cached['intra'].value,
                  inter=cached['inter'].value, document=cached['document'].value,
                  valid=cached_valid.value, paragraph=cached['paragraph'].value,
                  sentence=cached['sentence'].value)
    chunk = lambda x: jax.lax.dynamic_slice_in_dim(x, start, t, axis=1)
    q_side = jax.tree.map(chunk, k_side)
    # Running bilevel state: the last valid token written so far (unchanged if none).
    end = start + t
    filled = cached_valid.value & (slot_BxL < end)
    last = jnp.max(jnp.where(filled, slot_BxL, -1), axis=1)
    has = last >= 0
    at = lambda x: jnp.take_along_axis(x, jnp.maximum(last, 0)[:, None], axis=1)[:, 0]
    for n in ('intra', 'inter', 'document'):
      state[n].value = jnp.where(has, at(k_side.stream(n)), state[n].value)
    sep, _ = self._tables()
    last_sep.value = jnp.where(has, jnp.asarray(sep)[jnp.clip(at(buf.value), 0,
                                                              sep.shape[0] - 1)],
                               last_sep.value)
    index.value = end
    return q_side, k_side, start

  @nn.compact
  def __call__(self, tokens_BxT: jax.Array, *,
               positions: Optional[positions_lib.BilevelPositions] = None,
               valid_BxT: Optional[jax.Array] = None,
               decode: bool = False, return_hidden: bool = False,
               positions_rng: Optional[jax.Array] = None) -> jax.Array:
    """Logits [B, T, V] float32; with `return_hidden`, the final-normed hidden states
    [B, T, D] (compute dtype) that the head params['lm_head']['kernel'] [D, V] maps to them,
    for a loss that applies the head itself (training/chunked_loss.py).

    `positions_rng`: a key; with model.randomized_positions = L > 0 the positions of a full
    forward pass (not decode) are drawn from it (`randomize_positions`); None: the ordinary
    positions (the train steps pass one; evaluation, docs/design.md)."""
    cfg, scheme = self.config, self.config.scheme
    if tokens_BxT.ndim != 2:
      raise ValueError(f'tokens must be [B, T], got shape {tokens_BxT.shape}.')
    # Concrete (eager) tokens only; under jit an id >= vocab_size makes its row's logits NaN
    # (bipe_jax.input_checks says why the compiled program does not check).
    input_checks.check_token_ids(tokens_BxT, cfg.vocab_size, 'Transformer tokens', valid_BxT)
    b, t = tokens_BxT.shape
    dtype = cfg.compute_dtype

    sides = self._decode_sides(tokens_BxT, positions, valid_BxT) if decode else None
    randomize = (sides is None and bool(cfg.randomized_positions)
                 and positions_rng is not None)
    if sides is None:
      pos = self.compute_positions(tokens_BxT, valid_BxT) if positions is None else positions
      if randomize:  # the draw (docs/design.md: when, and from which key)
        pos = randomize_positions(cfg, pos, positions_rng)
      index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
      q_side = k_side = Side.from_positions(pos, index)
      cache_index = jnp.zeros((), jnp.int32)
    else:
      q_side, k_side, cache_index = sides
    if scheme.rotary != 'none':
      # sin/cos once per forward pass. Streams computed here from the token ids lie in [0, t)
      # (a bound the CPU path reads host tables up to); given positions or a decode cache may
      # hold any value.
      bound = t if sides is None and positions is None else None
      if randomize:
        bound = cfg.randomized_positions
      cos, sin = rotary_tables(cfg, q_side, bound)
      q_side = q_side.replace(rope_cos=cos, rope_sin=sin)

    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size,
                     embedding_init=initializers.logically_partitioned(_INIT,
                                                                       ('vocab', 'embed')),
                     name='embed')
    x = embed(tokens_BxT).astype(dtype)
    if scheme.input != 'none':
      x = x + input_positions(cfg, q_side)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))

    # Padding keys are masked when the config has a pad id, a validity mask is given, or the
    # cache may hold left padding (decode).
    mask_keys = decode or valid_BxT is not None
    if cfg.scan_layers:
      body = remat_lib.remat_layer(ScannedDecoderLayer, cfg.remat, scanned=True)
      stack = nn.scan(body, variable_axes={'params': 0, 'cache': 0},
                      split_rngs={'params': True}, length=cfg.num_layers,
                      in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
                      metadata_params={nn.PARTITION_NAME: 'layers'})
      x, _ = stack(cfg, decode, mask_keys, name=SCANNED_LAYERS)(x, q_side, k_side, cache_index)
    else:
      layer_cls = remat_lib.remat_layer(DecoderLayer, cfg.remat, scanned=False)
      nope_cfg = dataclasses.replace(cfg, position_encoding='nope', rope_fraction=1.0,
                                     fox_gate='learned')
      for i in range(cfg.num_layers):
        layer_cfg = nope_cfg if recipes.is_nope_layer(i, cfg.nope_every) else cfg
        x = layer_cls(layer_cfg, decode, mask_keys, name=f'layer_{i}')(x, q_side, k_side,
                                                                       cache_index)
    x = RMSNorm(cfg.rms_eps, dtype, name='final_norm')(x)
    if return_hidden:
      return x
    logits = Projection((cfg.hidden_size, cfg.vocab_size), ('embed', 'vocab'), 'btd,dv->btv',
                        dtype, cfg.kernels, name='lm_head')(x)
    return logits.astype(jnp.float32)


def abstract_params(module: nn.Module, batch: int = 1, length: int = 8) -> dict:
  """The parameter tree `module.init` makes for tokens [batch, length], as jax.ShapeDtypeStruct
  leaves (jax.eval_shape: nothing allocated, nothing compiled; logical-axis boxes removed)."""
  tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  shapes = jax.eval_shape(lambda t: module.init(jax.random.PRNGKey(0), t), tokens)
  return nn.meta.unbox(shapes['params'])


def count_params(cfg: ModelConfig, batch: int = 1, length: int = 8) -> int:
  """Number of parameters of `Transformer(cfg)`, from jax.eval_shape (nothing allocated)."""
  params = abstract_params(Transformer(cfg), batch, length)
  return int(sum(math.prod(x.shape) for x in jax.tree.leaves(params)))
