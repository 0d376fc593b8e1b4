"""DAPE V1's MLP on one tile of all heads, inside the fused kernels (dape_forward.py,
dape_backward.py), and the flat parameter vector the kernels read from SMEM.

Per (query, key) pair of a tile, with s_h the scaled scores and b_h the static bias of head h
(encodings/dape.py `dape_v1_transform`; features x = [s; b] (C = 2H) or s (C = H)):
  z_n = b_in[n] + sum_c w_in[c, n] x_c,   a_n = LeakyReLU_0.01(z_n),
  A_h = s_h + b_h + b_out[h] + sum_n w_out[n, h] a_n.
Backward, given dA_h (the logits' cotangent, zero at masked pairs):
  da_n = sum_h w_out[n, h] dA_h,  dz_n = da_n * (1 if z_n >= 0 else 0.01),
  dx_c = sum_n w_in[c, n] dz_n,   ds_h = dA_h + dx_h,   db_h = dA_h + dx_{H+h} (C = 2H),
  d w_in[c, n] = sum x_c dz_n,  d b_in[n] = sum dz_n,  d w_out[n, h] = sum a_n dA_h,
  d b_out[h] = sum dA_h  (sums over the tile's pairs).
The MLP runs as scalar x tile products on the vector unit (the weights are SMEM scalars; no
matmul: the features of a pair lie in different tiles): per pair 2 (C N + N H) FLOPs forward,
about three times that in the dQ kernel (with the parameters' gradients), twice in dK / dV.
The tiles live in VMEM scratch ([C, q, k] features, [H, q, k] logits, [N, q, k] hidden
pre-activations, [C, q, k] feature cotangents) and the hidden units run in a `fori_loop`, so
that only a few [q, k] values are live at a time (unrolled, Mosaic's stack outgrew the 16 MiB
of scoped VMEM at H = 12, N = 32).

`FlatParams` packs w_in [C, N], b_in [N], w_out [N, H], b_out [H] and the bias parameters [H, P]
(tile_bias.py) into one float32 vector, in that order (the kernels' SMEM input); the dQ kernel
accumulates the gradients as rows per hidden unit (`grad_rows_to_flat` packs them the same
way).
"""

import dataclasses

import jax
import jax.numpy as jnp

from bipe_jax.encodings import dape

LEAKY = dape.LEAKY_SLOPE


@dataclasses.dataclass(frozen=True)
class FlatParams:
  """Offsets of the packed vector: C input features (2H or H), N hidden units, H heads, P bias
  parameters per head."""
  features: int
  hidden: int
  heads: int
  bias_params: int

  @property
  def uses_bias_features(self) -> bool:
    return self.features == 2 * self.heads

  @property
  def sizes(self) -> tuple:
    c, n, h = self.features, self.hidden, self.heads
    return (c * n, n, n * h, h, h * self.bias_params)

  @property
  def size(self) -> int:
    return sum(self.sizes)

  def offset(self, part: int) -> int:
    return sum(self.sizes[:part])

  def w_in(self, c, n):
    return c * self.hidden + n

  def b_in(self, n):
    return self.offset(1) + n

  def w_out(self, n, h):
    return self.offset(2) + n * self.heads + h

  def b_out(self, h):
    return self.offset(3) + h

  def bias(self, h, p):
    return self.offset(4) + h * self.bias_params + p

  def pack(self, dape_params, bias_params_HxP) -> jax.Array:
    """float32 [size] from the DAPE parameters (dict w_in, b_in, w_out, b_out) and [H, P]."""
    parts = [dape_params['w_in'], dape_params['b_in'], dape_params['w_out'],
             dape_params['b_out'], bias_params_HxP]
    return jnp.concatenate([jnp.asarray(x, jnp.float32).reshape(-1) for x in parts])

  def unpack(self, flat) -> tuple:
    """(dict w_in, b_in, w_out, b_out, bias params [H, P]) of a vector [size] (gradients)."""
    shapes = [(self.features, self.hidden), (self.hidden,), (self.hidden, self.heads),
              (self.heads,), (self.heads, self.bias_params)]
    parts, start = [], 0
    for shape, size in zip(shapes, self.sizes):
      parts.append(flat[start:start + size].reshape(shape))
      start += size
    return dict(w_in=parts[0], b_in=parts[1], w_out=parts[2], b_out=parts[3]), parts[4]

  @property
  def grad_rows(self) -> int:
    """Rows per block of the gradient scratch `grad_rows_to_flat` reads (8-aligned)."""
    c, h = self.features, self.heads
    return -(-max(c + 1 + h, h + h * self.bias_params) // 8) * 8

  def grad_rows_to_flat(self, g_Mx_R) -> jax.Array:
    """The packed gradient [size] from the kernels' gradient rows [N + 1, grad_rows] (block n < N:
    rows c < C d w_in[c, n], row C d b_in[n], rows C + 1 + h d w_out[n, h]; block N: rows
    h < H d b_out[h], rows H + h P + p the bias parameters')."""
    c, n, h, p = self.features, self.hidden, self.heads, self.bias_params
    return jnp.concatenate([g_Mx_R[:n, :c].T.reshape(-1), g_Mx_R[:n, c],
                            g_Mx_R[:n, c + 1:c + 1 + h].reshape(-1), g_Mx_R[n, :h],
                            g_Mx_R[n, h:h + h * p]])


def head_bias(tile_bias, flat: FlatParams, w, h: int, qs_Qx1, ks_1xK):
  """float32 [q, k] static bias of head h (None for kind 'none'); w(i): the i-th packed scalar."""
  return tile_bias.bias_from(lambda p: w(flat.bias(h, p)), qs_Qx1, ks_1xK)


def leaky(z):
  return jnp.where(z >= 0, z, LEAKY * z)


def _row_sum(x_QxK):
  return jnp.sum(x_QxK, axis=0, keepdims=True)


def forward(s_fn, b_fn, flat: FlatParams, w, x_ref, logits_ref, z_ref=None) -> None:
  """The adapted logits of a tile (no mask) into logits_ref [H, q, k]; s_fn(h) / b_fn(h): head
  h's float32 [q, k] scores / static bias (None for kind 'none'). The features go to x_ref
  [C, q, k], and with z_ref [N, q, k] the hidden pre-activations (for the backward). The hidden
  units run in a loop (one live at a time; weights read from w(index), SMEM scalars)."""
  h_count, c_count = flat.heads, flat.features
  for h in range(h_count):
    s, b = s_fn(h), b_fn(h)
    x_ref[h] = s
    if flat.uses_bias_features:
      x_ref[h_count + h] = b
    out = s + w(flat.b_out(h))
    logits_ref[h] = out if b is None else out + b

  def unit(n, carry):
    z = w(flat.b_in(n)) + w(flat.w_in(0, n)) * x_ref[0]
    for c in range(1, c_count):
      z = z + w(flat.w_in(c, n)) * x_ref[c]
    if z_ref is not None:
      z_ref[n] = z
    a = leaky(z)
    for h in range(h_count):
      logits_ref[h] += w(flat.w_out(n, h)) * a
    return carry

  jax.lax.fori_loop(0, flat.hidden, unit, 0)


def backward(da_ref, z_ref, x_ref, dx_ref, flat: FlatParams, w, grad_ref=None, tile_bias=None,
             streams=None) -> None:
  """From the logits' cotangents dA in da_ref [H, q, k]: ds_h = dA_h + dx_h into da_ref[h] and
  db_h into dx_ref[h] (dx_ref [C, q, k] scratch; db_h = dA_h + dx_{H+h}, or dA_h when the bias
  is no feature). z_ref [N, q, k] and x_ref [C, q, k]: the forward's hidden pre-activations
  and features. With grad_ref [N + 1, grad_rows, k], adds the tile's parameter gradients
  summed over its queries (FlatParams.grad_rows_to_flat's rows; the bias parameters' through
  tile_bias.param_grad_tiles of db at the position streams (q [q, 1], k [1, k]))."""
  h_count, c_count = flat.heads, flat.features
  dx_ref[...] = jnp.zeros(dx_ref.shape, jnp.float32)

  def unit(n, carry):
    da = w(flat.w_out(n, 0)) * da_ref[0]
    for h in range(1, h_count):
      da = da + w(flat.w_out(n, h)) * da_ref[h]
    z = z_ref[n]
    dz = jnp.where(z >= 0, da, LEAKY * da)
    for c in range(c_count):
      dx_ref[c] += w(flat.w_in(c, n)) * dz
    if grad_ref is not None:
      rows = grad_ref.at[n]
      for c in range(c_count):
        rows[c:c + 1, :] += _row_sum(x_ref[c] * dz)
      rows[c_count:c_count + 1, :] += _row_sum(dz)
      a = leaky(z)
      for h in range(h_count):
        rows[c_count + 1 + h:c_count + 2 + h, :] += _row_sum(a * da_ref[h])
    return carry

  jax.lax.fori_loop(0, flat.hidden, unit, 0)
  for h in range(h_count):
    da = da_ref[h]
    if grad_ref is not None:
      rows = grad_ref.at[flat.hidden]
      rows[h:h + 1, :] += _row_sum(da)
    db = da + dx_ref[h_count + h] if flat.uses_bias_features else da
    da_ref[h] = da + dx_ref[h]  # ds
    dx_ref[h] = db
    if grad_ref is not None:
      terms = tile_bias.param_grad_tiles(lambda p, h=h: w(flat.bias(h, p)), *streams, db)
      for p, term in enumerate(terms):
        row = h_count + h * flat.bias_params + p
        rows[row:row + 1, :] += _row_sum(term)
