"""A minimal pure-JAX Llama training step, for profiling what XLA CPU can do at a shape.

Not part of the library: a benchmark-only prototype (params in a dict, no linen) whose
variants show which formulation choices matter on this CPU, so that changes to
bipe_jax/model.py and the training loss can be argued from measurements.

Variants (`Variant` fields):
  * attn_layout: 'bhqd' (projections straight into [B,H,T,Dh] by einsum) or 'bqhd'
    (projections to [B,T,H,Dh], attention einsums in that layout);
  * loss: 'full' (logits [B*T, V] materialised, then log-softmax) or 'chunked'
    (unembedding + log-sum-exp per chunk of `loss_chunk` tokens under jax.checkpoint,
    so the [B*T, V] logits never exist at once; gradients by autodiff of a lax.map);
  * matmul: 'einsum3d' (projections as einsums over [B, T, D] activations, as
    bipe_jax/model.py's `Projection`) or 'flat2d' (activations reshaped to [B*T, D] and
    every projection one 2-D `@`; the [B, H, T, Dh] attention layout is then reached by a
    reshape + transpose).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.hf_llama_step import Shape  # pylint: disable=g-import-not-at-top


@dataclasses.dataclass(frozen=True)
class Variant:
  attn_layout: str = 'bhqd'
  loss: str = 'full'
  loss_chunk: int = 256
  matmul: str = 'einsum3d'

  def __post_init__(self):
    if self.matmul not in ('einsum3d', 'flat2d'):
      raise ValueError(f"matmul must be 'einsum3d' or 'flat2d', got {self.matmul!r}")
    if self.attn_layout not in ('bhqd', 'bqhd'):
      raise ValueError(f"attn_layout must be 'bhqd' or 'bqhd', got {self.attn_layout!r}")
    if self.loss not in ('full', 'chunked'):
      raise ValueError(f"loss must be 'full' or 'chunked', got {self.loss!r}")


def init_params(shape: Shape, seed: int = 0) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  d, h, f, v = shape.width, shape.heads, shape.ffn, shape.vocab
  dh = d // h
  keys = iter(jax.random.split(jax.random.key(seed), 4 + 7 * shape.layers))
  n = lambda s, fan_in: jax.random.normal(next(keys), s, jnp.float32) * fan_in ** -0.5
  params = {'embed': n((v, d), 1.0), 'final_norm': jnp.ones((d,)),
            'lm_head': n((d, v), d)}
  for i in range(shape.layers):
    params[f'layer_{i}'] = {
        'attention_norm': jnp.ones((d,)), 'mlp_norm': jnp.ones((d,)),
        'query': n((d, h, dh), d), 'key': n((d, h, dh), d), 'value': n((d, h, dh), d),
        'out': n((h, dh, d), d), 'gate': n((d, f), d), 'up': n((d, f), d),
        'down': n((f, d), f)}
  return params


def _rms(x, scale, eps=1e-5):
  import jax  # pylint: disable=g-import-not-at-top
  return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + eps) * scale


def _rope(x, pos_T, axis_t: int):
  """Rotate-half RoPE over the last axis; positions along axis `axis_t` of x."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  dh = x.shape[-1]
  inv = 1.0 / (10000.0 ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))
  ang = pos_T[:, None].astype(jnp.float32) * inv[None, :]  # [T, Dh/2]
  cos = jnp.concatenate([jnp.cos(ang)] * 2, -1)
  sin = jnp.concatenate([jnp.sin(ang)] * 2, -1)
  bshape = [1] * x.ndim
  bshape[axis_t], bshape[-1] = x.shape[axis_t], dh
  cos, sin = cos.reshape(bshape), sin.reshape(bshape)
  x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
  return x * cos + jnp.concatenate([-x2, x1], -1) * sin


def _attention_block(p, x_BxTxD, layout: str, matmul: str = 'einsum3d'):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  b, t, d = x_BxTxD.shape
  h, dh = p['query'].shape[1:]
  pos = jnp.arange(t)
  mask = jnp.tril(jnp.ones((t, t), bool))
  if matmul == 'flat2d':
    x_NxD = x_BxTxD.reshape(b * t, d)
    heads = lambda w: (x_NxD @ w.reshape(d, h * dh)).reshape(b, t, h, dh).transpose(0, 2, 1, 3)
    q, k, v = heads(p['query']), heads(p['key']), heads(p['value'])
    q, k = _rope(q, pos, 2), _rope(k, pos, 2)
    s = jnp.einsum('bhqk,bhsk->bhqs', q, k) * dh ** -0.5
    s = jnp.where(mask, s, -1e30)
    o = jnp.einsum('bhqs,bhsk->bhqk', jax.nn.softmax(s, -1), v)
    o_NxHDh = o.transpose(0, 2, 1, 3).reshape(b * t, h * dh)
    return (o_NxHDh @ p['out'].reshape(h * dh, d)).reshape(b, t, d)
  if layout == 'bhqd':
    q = jnp.einsum('btd,dhk->bhtk', x_BxTxD, p['query'])
    k = jnp.einsum('btd,dhk->bhtk', x_BxTxD, p['key'])
    v = jnp.einsum('btd,dhk->bhtk', x_BxTxD, p['value'])
    q, k = _rope(q, pos, 2), _rope(k, pos, 2)
    s = jnp.einsum('bhqk,bhsk->bhqs', q, k) * dh ** -0.5
    s = jnp.where(mask, s, -1e30)
    o = jnp.einsum('bhqs,bhsk->bhqk', jax.nn.softmax(s, -1), v)
    return jnp.einsum('bhtk,hkd->btd', o, p['out'])
  q = jnp.einsum('btd,dhk->bthk', x_BxTxD, p['query'])
  k = jnp.einsum('btd,dhk->bthk', x_BxTxD, p['key'])
  v = jnp.einsum('btd,dhk->bthk', x_BxTxD, p['value'])
  q, k = _rope(q, pos, 1), _rope(k, pos, 1)
  s = jnp.einsum('bqhk,bshk->bhqs', q, k) * dh ** -0.5
  s = jnp.where(mask, s, -1e30)
  o = jnp.einsum('bhqs,bshk->bqhk', jax.nn.softmax(s, -1), v)
  return jnp.einsum('bthk,hkd->btd', o, p['out'])


def hidden_states(params, tokens_BxT, variant: Variant):
  """Final-normed hidden states [B, T, D]."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  x = params['embed'][tokens_BxT]
  n_layers = sum(1 for k in params if k.startswith('layer_'))
  for i in range(n_layers):
    p = params[f'layer_{i}']
    x = x + _attention_block(p, _rms(x, p['attention_norm']), variant.attn_layout,
                             variant.matmul)
    y = _rms(x, p['mlp_norm'])
    if variant.matmul == 'flat2d':
      b, t, d = y.shape
      y_NxD = y.reshape(b * t, d)
      x = x + ((jax.nn.silu(y_NxD @ p['gate']) * (y_NxD @ p['up'])) @ p['down']).reshape(b, t, d)
    else:
      x = x + jnp.einsum('btf,fd->btd',
                         jax.nn.silu(jnp.einsum('btd,df->btf', y, p['gate']))
                         * jnp.einsum('btd,df->btf', y, p['up']), p['down'])
  return _rms(x, params['final_norm'])


def next_token_loss(params, tokens_BxT, variant: Variant):
  """Mean next-token cross-entropy (float32) over tokens[:, 1:]."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  h = hidden_states(params, tokens_BxT, variant)[:, :-1]
  tgt = tokens_BxT[:, 1:]
  d = h.shape[-1]
  h_NxD, tgt_N = h.reshape(-1, d), tgt.reshape(-1)
  w = params['lm_head']
  if variant.loss == 'full':
    logits = h_NxD @ w
    lse = jax.nn.logsumexp(logits, -1)
    return (lse - jnp.take_along_axis(logits, tgt_N[:, None], -1)[:, 0]).mean()
  n = h_NxD.shape[0]
  c = variant.loss_chunk
  pad = (-n) % c
  h_p = jnp.pad(h_NxD, ((0, pad), (0, 0))).reshape(-1, c, d)
  t_p = jnp.pad(tgt_N, (0, pad)).reshape(-1, c)
  valid = (jnp.arange(n + pad) < n).reshape(-1, c)

  @jax.checkpoint
  def chunk(args):
    hc, tc, vc = args
    logits = hc @ w
    nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, tc[:, None], -1)[:, 0]
    return jnp.where(vc, nll, 0.0).sum()

  return jax.lax.map(chunk, (h_p, t_p, valid)).sum() / n


def make_train_step(shape: Shape, variant: Variant, *, lr: float = 1e-3, seed: int = 0
                    ) -> Callable[[], object]:
  """Returns step() running one jitted AdamW step (donated state) on a fixed batch.

  `step.hlo_text()` gives the compiled step's optimised HLO (benchmarks/profile_step.py).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  params = init_params(shape, seed)
  opt = optax.adamw(lr, b1=0.9, b2=0.98, weight_decay=0.01)
  state = [params, opt.init(params)]
  tokens = jax.random.randint(jax.random.key(seed + 1), (shape.batch, shape.seq), 0,
                              shape.vocab)

  @jax.jit
  def _step(params, opt_state, tokens):
    loss, grads = jax.value_and_grad(next_token_loss)(params, tokens, variant)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  _step = jax.jit(_step.__wrapped__, donate_argnums=(0, 1))

  def step():
    state[0], state[1], loss = _step(state[0], state[1], tokens)
    return loss

  step.hlo_text = lambda: _step.lower(state[0], state[1], tokens).compile().as_text()
  return step
