"""DAPE: data-adaptive positional encoding (Zheng et al. 2024), V1 (pointwise MLP) and V2 (conv).

V1: A = S + B + f([S; B]) where S [B, H, Q, K] are the attention scores of all heads, B a static
    bias (ALiBi / Kerple / FIRE ...) and f a Linear(2H -> hidden) -> LeakyReLU(0.01) ->
    Linear(hidden -> H) applied independently at every (q, k). Without bias features:
    A = S (+ B) + f(S), f over H features.
V2: the same, but f is Conv(2H -> hidden, kernel (1, k)) -> LeakyReLU -> Conv(hidden -> H,
    kernel (1, k)) along the key axis, applied to tril([S; B]) (zeroed where k > q BEFORE the
    convolution, so no future key leaks into a past one), 'same' zero padding.

Scores must be UNMASKED (finite): the caller applies the causal mask after the transform.
Everything is einsums over the head axis on the [B, H, Q, K] layout (no transpose of the big
tensor). Outputs are float32 (inputs are promoted).

Blockwise use of V2 (key halo): the conv output at key j needs the first-layer activations at
j-r..j+r (r = kernel_size // 2), which need the inputs at j-2r..j+2r. So a key block
[k0, k1) must be computed with the keys [k0 - 2r, k1 + 2r) present (halo of 2*(kernel//2) per
side), positions outside [0, T) marked invalid in `k_valid` (treated as the zero padding of BOTH
convolutions), and the halo cropped afterwards; the result then equals the full-sequence one.
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from bipe_jax.encodings import initializers

LEAKY_SLOPE = 0.01  # torch.nn.LeakyReLU default


def dapev2_halo(kernel_size: int) -> int:
  """Extra keys needed on each side of a key block for `DapeV2` (2 * (kernel_size // 2))."""
  return 2 * (kernel_size // 2)


def _mix_heads(x_BxCxQxK, w_CxN):
  """Pointwise linear map over the head axis: [B, C, Q, K] x [C, N] -> [B, N, Q, K].

  Written as a batched matmul [B, N, C] @ [B, C, Q*K] (batch first, then the output rows):
  XLA then emits no transpose of the big tensor, in the forward or the backward pass
  (a plain 'bcqk,cn->bnqk' einsum costs a transpose of every [B, N, Q, K] array).
  """
  b, c, q, k = x_BxCxQxK.shape
  n = w_CxN.shape[1]
  w_BxNxC = jnp.broadcast_to(jnp.asarray(w_CxN, x_BxCxQxK.dtype).T, (b, n, c))
  out = jnp.einsum('bnc,bcx->bnx', w_BxNxC, x_BxCxQxK.reshape(b, c, q * k))
  return out.reshape(b, n, q, k)


def _bias_term(values_N):
  return jnp.asarray(values_N)[None, :, None, None]


def _split_features(scores, bias, w_CxN, num_heads, what):
  """Applies a [C, N] map to the concatenation [S; B] without building it."""
  if bias is None:
    if w_CxN.shape[0] != num_heads:
      raise ValueError(f'{what}: weights expect {w_CxN.shape[0]} input features, but scores '
                       f'have {num_heads} heads and no bias was given.')
    return _mix_heads(scores, w_CxN)
  if w_CxN.shape[0] != 2 * num_heads:
    raise ValueError(f'{what}: weights expect {w_CxN.shape[0]} input features, expected '
                     f'2*H = {2 * num_heads} for scores and bias.')
  return _mix_heads(scores, w_CxN[:num_heads]) + _mix_heads(bias, w_CxN[num_heads:])


def dape_v1_transform(scores_BxHxQxK: jax.Array, bias_BxHxQxK: Optional[jax.Array],
                      params) -> jax.Array:
  """DAPE V1 adapted logits [B, H, Q, K] float32 (no mask applied).

  Args:
    scores_BxHxQxK: q.k / sqrt(Dh), unmasked.
    bias_BxHxQxK: static bias [1 or B, H, Q, K], or None for the bias-free form A = S + f(S).
    params: dict with 'w_in' [C, N] (C = 2H with bias, H without), 'b_in' [N],
      'w_out' [N, H], 'b_out' [H]. With a bias and C = H, the bias is added but not a feature.
  """
  s = scores_BxHxQxK.astype(jnp.float32)
  h = s.shape[1]
  b = None if bias_BxHxQxK is None else bias_BxHxQxK.astype(jnp.float32)
  use_b = b is not None and params['w_in'].shape[0] == 2 * h
  hidden = _split_features(s, b if use_b else None, params['w_in'], h, 'dape_v1_transform')
  hidden = jax.nn.leaky_relu(hidden + _bias_term(params['b_in']), LEAKY_SLOPE)
  f = _mix_heads(hidden, params['w_out']) + _bias_term(params['b_out'])
  return s + f if b is None else s + b + f


def _shift_sum(y_BxKSxNxQxK):
  """sum_tap y[:, tap, ..., k + tap - r] with zeros outside [0, K): the 'same' conv taps."""
  ks, k_len = y_BxKSxNxQxK.shape[1], y_BxKSxNxQxK.shape[-1]
  r = ks // 2
  padded = jnp.pad(y_BxKSxNxQxK, [(0, 0)] * 4 + [(r, ks - 1 - r)])
  return sum(padded[:, tap, ..., tap:tap + k_len] for tap in range(ks))


def _conv_keys(x_BxCxQxK, w_KSxCxN):
  """'same' zero-padded cross-correlation along the key axis (torch Conv2d, kernel (1, ks)).

  All taps in one matmul on the unshifted input ([ks*N, C] weights), then the outputs are
  shifted and summed (an elementwise fusion): no shifted copies of the input.
  """
  ks, c, n = w_KSxCxN.shape
  b, _, q, k = x_BxCxQxK.shape
  w_all = jnp.transpose(w_KSxCxN, (1, 0, 2)).reshape(c, ks * n)
  y = _mix_heads(x_BxCxQxK, w_all).reshape(b, ks, n, q, k)
  return _shift_sum(y)


def dape_v2_transform(scores_BxHxQxK: jax.Array, bias_BxHxQxK: Optional[jax.Array], params,
                      kernel_size: int = 3, *, q_pos_BxQ: Optional[jax.Array] = None,
                      k_pos_BxK: Optional[jax.Array] = None,
                      k_valid_BxK: Optional[jax.Array] = None) -> jax.Array:
  """DAPE V2 adapted logits [B, H, Q, K] float32 (no mask applied).

  Args:
    scores_BxHxQxK: unmasked scores; may include halo keys (see module docstring).
    bias_BxHxQxK: static bias [1 or B, H, Q, K] or None (bias-free form).
    params: 'w_in' [ks, C, N], 'b_in' [N], 'w_out' [ks, N, H], 'b_out' [H].
    kernel_size: ks, must match the weights (odd).
    q_pos_BxQ, k_pos_BxK: TOKEN positions (causal order, not segment ids) of the queries and
      keys, for the tril; default arange(Q), arange(K).
    k_valid_BxK: False at keys outside the sequence (halo beyond [0, T)): zero padding.
  """
  if kernel_size % 2 != 1 or kernel_size < 1:
    raise ValueError(f'dapev2 kernel_size must be a positive odd number, got {kernel_size}.')
  if params['w_in'].shape[0] != kernel_size:
    raise ValueError(f'dapev2: weights have kernel {params["w_in"].shape[0]}, expected '
                     f'kernel_size={kernel_size}.')
  s = scores_BxHxQxK.astype(jnp.float32)
  _, h, q_len, k_len = s.shape
  if q_pos_BxQ is None:
    q_pos_BxQ = jnp.arange(q_len, dtype=jnp.int32)[None]
  if k_pos_BxK is None:
    k_pos_BxK = jnp.arange(k_len, dtype=jnp.int32)[None]
  keep_Bx1xQxK = k_pos_BxK[:, None, None, :] <= q_pos_BxQ[:, None, :, None]
  valid_Bx1x1xK = None
  if k_valid_BxK is not None:
    valid_Bx1x1xK = k_valid_BxK[:, None, None, :]
    keep_Bx1xQxK = keep_Bx1xQxK & valid_Bx1x1xK
  b = None if bias_BxHxQxK is None else bias_BxHxQxK.astype(jnp.float32)
  use_b = b is not None and params['w_in'].shape[1] == 2 * h
  w_in, w_out = params['w_in'], params['w_out']
  s_tril = jnp.where(keep_Bx1xQxK, s, 0.)
  if use_b:
    b_tril = jnp.where(keep_Bx1xQxK, b, 0.)
    hidden = _conv_keys(s_tril, w_in[:, :h]) + _conv_keys(b_tril, w_in[:, h:])
  else:
    if w_in.shape[1] != h:
      raise ValueError(f'dape_v2_transform: weights expect {w_in.shape[1]} input features, '
                       f'but scores have {h} heads and no bias features.')
    hidden = _conv_keys(s_tril, w_in)
  hidden = jax.nn.leaky_relu(hidden + _bias_term(params['b_in']), LEAKY_SLOPE)
  if valid_Bx1x1xK is not None:
    hidden = jnp.where(valid_Bx1x1xK, hidden, 0.)
  f = _conv_keys(hidden, w_out) + _bias_term(params['b_out'])
  return s + f if b is None else s + b + f


class DapeV1(nn.Module):
  """DAPE V1 score transform. Params 'w_in' [C, hidden], 'b_in', 'w_out' [hidden, H], 'b_out'.

  C = 2H when `use_bias_features` (official), else H (f(S) only; a given bias is still added).
  """
  num_heads: int
  hidden: int = 32
  use_bias_features: bool = True

  @nn.compact
  def __call__(self, scores_BxHxQxK: jax.Array,
               bias_BxHxQxK: Optional[jax.Array] = None) -> jax.Array:
    if self.use_bias_features and bias_BxHxQxK is None:
      raise ValueError('DapeV1(use_bias_features=True) needs a bias; pass one or set '
                       'use_bias_features=False.')
    c = (2 if self.use_bias_features else 1) * self.num_heads
    params = dict(
        w_in=self.param('w_in', initializers.torch_uniform(c), (c, self.hidden), jnp.float32),
        b_in=self.param('b_in', initializers.torch_uniform(c), (self.hidden,), jnp.float32),
        w_out=self.param('w_out', initializers.torch_uniform(self.hidden), (self.hidden, self.num_heads),
                         jnp.float32),
        b_out=self.param('b_out', initializers.torch_uniform(self.hidden), (self.num_heads,), jnp.float32))
    return dape_v1_transform(scores_BxHxQxK, bias_BxHxQxK, params)


class DapeV2(nn.Module):
  """DAPE V2 score transform (conv over keys). Params 'w_in' [ks, C, hidden], 'b_in',
  'w_out' [ks, hidden, H], 'b_out'. See the module docstring for the key halo
  (`dapev2_halo(kernel_size)` keys per side)."""
  num_heads: int
  hidden: int = 32
  kernel_size: int = 3
  use_bias_features: bool = True

  @nn.compact
  def __call__(self, scores_BxHxQxK: jax.Array, bias_BxHxQxK: Optional[jax.Array] = None,
               q_pos_BxQ: Optional[jax.Array] = None, k_pos_BxK: Optional[jax.Array] = None,
               k_valid_BxK: Optional[jax.Array] = None) -> jax.Array:
    if self.use_bias_features and bias_BxHxQxK is None:
      raise ValueError('DapeV2(use_bias_features=True) needs a bias; pass one or set '
                       'use_bias_features=False.')
    ks = self.kernel_size
    c = (2 if self.use_bias_features else 1) * self.num_heads
    params = dict(
        w_in=self.param('w_in', initializers.torch_uniform(c * ks), (ks, c, self.hidden), jnp.float32),
        b_in=self.param('b_in', initializers.torch_uniform(c * ks), (self.hidden,), jnp.float32),
        w_out=self.param('w_out', initializers.torch_uniform(self.hidden * ks),
                         (ks, self.hidden, self.num_heads), jnp.float32),
        b_out=self.param('b_out', initializers.torch_uniform(self.hidden * ks), (self.num_heads,),
                         jnp.float32))
    return dape_v2_transform(scores_BxHxQxK, bias_BxHxQxK, params, ks, q_pos_BxQ=q_pos_BxQ,
                             k_pos_BxK=k_pos_BxK, k_valid_BxK=k_valid_BxK)
