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
The MLP runs as scalar x tile products on the vector unit (the weights are SMEM scalars): per
pair 2 (C N + N H) FLOPs forward, about three times that in the backward.

`FlatParams` packs w_in [C, N], b_in [N], w_out [N, H], b_out [H] and the bias parameters [H, P]
(tile_bias.py) into one float32 vector, in that order; the parameter gradients come back as rows
in the same order (`unpack`).
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


def head_bias(tile_bias, flat: FlatParams, w, h: int, qs_Qx1, ks_1xK):
  """float32 [q, k] static bias of head h (None for kind 'none'); w(i): the i-th packed scalar."""
  return tile_bias.bias_from(lambda p: w(flat.bias(h, p)), qs_Qx1, ks_1xK)


def features(s_list, b_list, flat: FlatParams) -> list:
  """The MLP's C input tiles: [s; b] or s."""
  return list(s_list) + (list(b_list) if flat.uses_bias_features else [])


def forward(s_list, b_list, flat: FlatParams, w):
  """(A [H] tiles, z [N] tiles, a [N] tiles): the adapted logits of a tile (no mask) and the
  MLP's pre- and post-activation hidden tiles; s_list / b_list: H float32 [q, k] tiles (b_list
  entries None for kind 'none')."""
  x = features(s_list, b_list, flat)
  z, a = [], []
  for n in range(flat.hidden):
    acc = w(flat.w_in(0, n)) * x[0]
    for c in range(1, flat.features):
      acc = acc + w(flat.w_in(c, n)) * x[c]
    acc = acc + w(flat.b_in(n))
    z.append(acc)
    a.append(jnp.where(acc >= 0, acc, LEAKY * acc))
  logits = []
  for h in range(flat.heads):
    out = s_list[h] + w(flat.b_out(h))
    if b_list[h] is not None:
      out = out + b_list[h]
    for n in range(flat.hidden):
      out = out + w(flat.w_out(n, h)) * a[n]
    logits.append(out)
  return logits, z, a


def backward(da_list, z, flat: FlatParams, w):
  """(dz [N] tiles, ds [H] tiles, db [H] tiles) from the logits' cotangents dA [H]."""
  dz = []
  for n in range(flat.hidden):
    acc = w(flat.w_out(n, 0)) * da_list[0]
    for h in range(1, flat.heads):
      acc = acc + w(flat.w_out(n, h)) * da_list[h]
    dz.append(jnp.where(z[n] >= 0, acc, LEAKY * acc))
  dx = []
  for c in range(flat.features):
    acc = w(flat.w_in(c, 0)) * dz[0]
    for n in range(1, flat.hidden):
      acc = acc + w(flat.w_in(c, n)) * dz[n]
    dx.append(acc)
  h = flat.heads
  ds = [da_list[i] + dx[i] for i in range(h)]
  db = [da_list[i] + dx[h + i] for i in range(h)] if flat.uses_bias_features else list(da_list)
  return dz, ds, db


def param_grad_tiles(x, a, dz, da_list, db_list, tile_bias, flat: FlatParams, w, qs_Qx1,
                     ks_1xK) -> list:
  """[size] (index, float32 [q, k] tile) pairs whose sums over the tile are the packed
  parameters' gradients (parameters without a gradient: no entry)."""
  out = []
  for c in range(flat.features):
    for n in range(flat.hidden):
      out.append((flat.w_in(c, n), x[c] * dz[n]))
  out += [(flat.b_in(n), dz[n]) for n in range(flat.hidden)]
  for n in range(flat.hidden):
    for h in range(flat.heads):
      out.append((flat.w_out(n, h), a[n] * da_list[h]))
  out += [(flat.b_out(h), da_list[h]) for h in range(flat.heads)]
  for h in range(flat.heads):
    terms = tile_bias.param_grad_tiles(lambda p, h=h: w(flat.bias(h, p)), qs_Qx1, ks_1xK,
                                       db_list[h])
    out += [(flat.bias(h, p), term) for p, term in enumerate(terms)]
  return out
