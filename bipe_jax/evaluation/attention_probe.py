"""The attention logits of one decoder layer, taken apart: scores S = q.k / sqrt(Dh), the static
positional bias B, and the final logits A (S + B, or DAPE's transform of (S, B)), [B, H, T, T].

`layer_inputs` runs the model once and keeps the input of every layer's attention (the output of
its `attention_norm`); `layer_logits` recomputes that layer's logits with the layer's own
parameters and the model's own bias and transform modules (`AttentionProbe` is the model's
Attention with the value path and the softmax left out), so what is drawn is what the model
computes.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax.attention import blocks as attention_blocks
from bipe_jax import model as model_lib
from bipe_jax.encodings import rope


class AttentionProbe(model_lib.Attention):
  """model.Attention's logits: __call__(x [B, T, D], side) -> dict of float32 [B, H, T, T]:
  'scores' (S), 'bias' (B; absent without a bias) and 'logits' (A, before the causal mask)."""

  @nn.compact
  def __call__(self, x_BxTxD, side: model_lib.Side):  # pylint: disable=arguments-differ
    cfg, scheme = self.config, self.config.scheme
    h, g, dh, d = cfg.num_heads, cfg.kv_heads, cfg.head_size, cfg.hidden_size
    proj = lambda n, shape, axes, eq: model_lib.Projection(shape, axes, eq, cfg.compute_dtype,
                                                           cfg.kernels, name=n)
    q = proj('query', (d, h, dh), ('embed', 'heads', 'head_dim'), 'btd,dhk->bhtk')(x_BxTxD)
    k = proj('key', (d, g, dh), ('embed', 'kv_heads', 'head_dim'), 'btd,dgk->bgtk')(x_BxTxD)
    if scheme.rotary != 'none':
      if cfg.rope_log_scale:
        scale = rope.rope_log_scale(side.stream(scheme.rotary), cfg.train_length)
        q = q * scale[:, None, :, None].astype(q.dtype)
      cos, sin = model_lib.rotary_tables(cfg, side)
      q, k = rope.rotate(q, cos, sin), rope.rotate(k, cos, sin)
    scores = attention_blocks.attention_scores(q, k, 1.0 / np.sqrt(dh)).astype(jnp.float32)
    out = {'scores': scores}
    bias_fn = self._bias_fn() if scheme.bias != 'none' else None
    bias = None
    if bias_fn is not None:
      streams = side.stream(scheme.bias_stream)
      bias = bias_fn(streams, streams).astype(jnp.float32)
      out['bias'] = bias
    transform = self._transform()
    if transform is not None:
      in_range = jnp.ones(side.index.shape, bool)
      out['logits'] = transform.fn(scores, bias, side.index, side.index, in_range).astype(
          jnp.float32)
    else:
      out['logits'] = scores if bias is None else scores + bias
    return out


def unscanned(cfg: model_lib.ModelConfig, params: dict) -> tuple:
  """(config, params) with one parameter tree per layer ('layer_i'), as the probe reads them."""
  if not cfg.scan_layers:
    return cfg, params
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(cfg, scan_layers=False), model_lib.unstack_layer_params(params)


def layer_inputs(cfg: model_lib.ModelConfig, params: dict, tokens_BxT) -> tuple:
  """(attention inputs per layer: list of [B, T, D], the Side of the tokens' positions)."""
  cfg, params = unscanned(cfg, params)
  model = model_lib.Transformer(cfg)
  tokens = jnp.asarray(tokens_BxT, jnp.int32)
  _, state = model.apply({'params': params}, tokens, mutable=['intermediates'],
                         capture_intermediates=lambda m, _: m.name == 'attention_norm')
  layers = state['intermediates']
  inputs = [layers[f'layer_{i}']['attention_norm']['__call__'][0]
            for i in range(cfg.num_layers)]
  pos = model.apply({'params': params}, tokens, method=model_lib.Transformer.compute_positions)
  index = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  return inputs, model_lib.Side.from_positions(pos, index)


def layer_logits(cfg: model_lib.ModelConfig, params: dict, tokens_BxT, layer: int) -> dict:
  """AttentionProbe's dict for `layer` on `tokens` [B, T] (NumPy float32 arrays), plus
  'weights': the attention probabilities [B, H, T, T] (causal softmax of the logits)."""
  if not 0 <= layer < cfg.num_layers:
    raise ValueError(f'--layer={layer}: the model has layers 0..{cfg.num_layers - 1}')
  cfg, params = unscanned(cfg, params)
  inputs, side = layer_inputs(cfg, params, tokens_BxT)
  probe = AttentionProbe(cfg)
  out = jax.jit(lambda p, x, s: probe.apply({'params': p}, x, s))(
      params[f'layer_{layer}']['attention'], inputs[layer], side)
  t = out['logits'].shape[-1]
  causal = jnp.tril(jnp.ones((t, t), bool))
  out['weights'] = jax.nn.softmax(jnp.where(causal, out['logits'], -jnp.inf), axis=-1)
  return {n: np.asarray(v) for n, v in out.items()}
