"""The bias kinds the Pallas kernel computes per tile, from position slices (no [T, S] array).

A `TileBias` names a kind and its static settings; its per-head parameters travel as one float32
array `params_HxP` (P per kind, below). Inside a kernel, `bias(params_1xP, qs_Qx1, ks_1xK)`
returns the [q, k] float32 bias tile of one head and `param_grads(params_1xP, qs, ks, ds_QxK)`
the [1, P] sums  sum_{q,k} ds[q, k] * d bias[q, k] / d params[p]  (the parameter gradient of one
tile, given the logits' cotangent `ds`). Semantics equal the project's encodings: the distance is
max(q - k, 0) of the stream the scheme names (bipe_jax/encodings/alibi.py, kerple.py, t5.py).

  kind      params [H, P]                          bias[q, k]
  'none'    P = 1 (unused zeros)                   0
  'alibi'   P = 1: slope_factor * slope_h (fixed)  -params[0] * d
  'kerple'  P = 2: (p_h, a_h), clamped >= 0.01     -p * log1p(a * d)
  't5'      P = num_buckets: the table's row h     table[bucket(d)]   (causal, one direction)
  'fox'     P = 1 (unused zeros)                   c_q[q] - c_k[k]   (FoX, encodings/fox.py)

FoX reads no int stream: its bias is a difference of float positions c (cumulative log forget
gates, per head), which travel as rows [B, H, 1, T] beside the int side arrays and get
gradients (`uses_float_positions`): d c_q[i] = sum_k dS[i, k], d c_k[j] = -sum_q dS[q, j].

FIRE (an MLP of a normalised log distance) is not covered: its parameters are shared by all
heads and its per-tile cost is hidden-width times that of the others.
"""

import dataclasses

import jax
import jax.numpy as jnp

from bipe_jax.encodings import t5

KINDS = ('none', 'alibi', 'kerple', 't5', 'fox')


@dataclasses.dataclass(frozen=True)
class TileBias:
  """kind: one of KINDS; t5_buckets / t5_max_distance: the T5 bucketing (kind 't5' only)."""
  kind: str = 'none'
  t5_buckets: int = 32
  t5_max_distance: int = 128

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f'pallas attention: bias kind {self.kind!r} is not one of {KINDS}.')

  @property
  def num_params(self) -> int:
    return {'none': 1, 'alibi': 1, 'kerple': 2, 't5': self.t5_buckets, 'fox': 1}[self.kind]

  @property
  def uses_float_positions(self) -> bool:
    """Whether the kernels read the float positions c (rows [1, q] / [1, k] per head)."""
    return self.kind == 'fox'

  def check_params(self, params_HxP: jax.Array, num_heads: int) -> None:
    want = (num_heads, self.num_params)
    if tuple(params_HxP.shape) != want:
      raise ValueError(f'pallas attention: bias {self.kind!r} needs params [H, P]={want}, '
                       f'got {tuple(params_HxP.shape)}.')

  def _distance(self, qs_Qx1, ks_1xK):
    return jnp.maximum(qs_Qx1 - ks_1xK, 0)

  def _t5_onehots(self, qs_Qx1, ks_1xK):
    bucket = t5.t5_relative_bucket(self._distance(qs_Qx1, ks_1xK), self.t5_buckets,
                                   self.t5_max_distance, bidirectional=False)
    return [bucket == n for n in range(self.t5_buckets)]

  def bias(self, params_1xP, qs_Qx1, ks_1xK, c_q_Qx1=None, c_k_1xK=None):
    """float32 [q, k] bias of one head (None for kind 'none'); c: FoX's float positions."""
    return self.bias_from(lambda n: params_1xP[:, n:n + 1], qs_Qx1, ks_1xK, c_q_Qx1, c_k_1xK)

  def bias_from(self, param, qs_Qx1, ks_1xK, c_q_Qx1=None, c_k_1xK=None):
    """`bias` with the head's parameters read through `param(n)` -> the n-th parameter as a
    value that broadcasts over the tile ([1, 1] on TPU, a scalar in the GPU kernels, which
    cannot slice a loaded array)."""
    if self.kind == 'none':
      return None
    if self.kind == 'fox':
      return c_q_Qx1 - c_k_1xK
    if self.kind == 't5':
      out = jnp.zeros((qs_Qx1.shape[0], ks_1xK.shape[1]), jnp.float32)
      for n, hit in enumerate(self._t5_onehots(qs_Qx1, ks_1xK)):
        out = jnp.where(hit, param(n), out)
      return out
    d = self._distance(qs_Qx1, ks_1xK).astype(jnp.float32)
    if self.kind == 'alibi':
      return -param(0) * d
    return -param(0) * jnp.log1p(param(1) * d)  # kerple

  def param_grads(self, params_1xP, qs_Qx1, ks_1xK, ds_QxK):
    """float32 [1, P]: the tile's contribution to d loss / d params (zeros for fixed kinds)."""
    if self.kind in ('none', 'alibi', 'fox'):
      return jnp.zeros((1, self.num_params), jnp.float32)
    total = lambda x: jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)
    terms = self.param_grad_tiles(lambda n: params_1xP[:, n:n + 1], qs_Qx1, ks_1xK, ds_QxK)
    return jnp.concatenate([total(term) for term in terms], axis=1)

  def param_grad_tiles(self, param, qs_Qx1, ks_1xK, ds_QxK) -> list:
    """[P] float32 [q, k] tiles whose sums are d loss / d params[n] (empty for kinds without
    parameters: 'none', 'alibi', and 'fox', whose gradient goes to its positions c instead);
    parameters read through `param(n)` as in `bias_from`."""
    if self.kind in ('none', 'alibi', 'fox'):
      return []
    if self.kind == 't5':
      return [jnp.where(hit, ds_QxK, 0.0) for hit in self._t5_onehots(qs_Qx1, ks_1xK)]
    d = self._distance(qs_Qx1, ks_1xK).astype(jnp.float32)
    p, a = param(0), param(1)
    return [ds_QxK * -jnp.log1p(a * d), ds_QxK * (-p * d / (1.0 + a * d))]
