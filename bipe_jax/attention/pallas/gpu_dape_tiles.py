"""DAPE V1's MLP on one tile of all heads, inside the GPU (Triton) DAPE kernels.

The math of dape_tile.py (its docstring has the formulas), written for Triton: a Triton program
has no scratch memory to index by head, so a tile's heads, features and hidden units are Python
lists of [q, k] float32 values (unrolled), and the parameters are scalars read from the packed
vector (`dape_tile.FlatParams`) through `w(index)`. The hidden pre-activations are not kept:
the backward recomputes each one from the features (C products per unit), so at most a few
[q, k] values per head and feature are live. Parameter gradients of a tile come as a vector
(`grad_vector`) of the packed length padded to a power of two (Triton's loads and stores).
"""

import jax
import jax.numpy as jnp

from bipe_jax.attention.pallas import dape_tile


def padded_size(flat: dape_tile.FlatParams) -> int:
  """The packed length rounded up to a power of two (Triton loads and stores)."""
  return 1 << max(0, (flat.size - 1).bit_length())


def features(s_list, b_list, flat: dape_tile.FlatParams) -> list:
  """The MLP's inputs [C] of [q, k]: the scores, then the biases when C = 2H."""
  return list(s_list) + (list(b_list) if flat.uses_bias_features else [])


def _hidden(x_list, flat, w, n: int):
  z = w(flat.b_in(n)) + w(flat.w_in(0, n)) * x_list[0]
  for c in range(1, flat.features):
    z = z + w(flat.w_in(c, n)) * x_list[c]
  return z


def adapted_logits(s_list, b_list, flat: dape_tile.FlatParams, w) -> list:
  """The adapted logits [H] of [q, k] (no mask) from the scaled scores s and static biases b,
  [H] of [q, k] each: A_h = s_h + b_h + b_out[h] + sum_n w_out[n, h] LeakyReLU(z_n)."""
  x = features(s_list, b_list, flat)
  logits = [s + b + w(flat.b_out(h)) for h, (s, b) in enumerate(zip(s_list, b_list))]
  for n in range(flat.hidden):
    a = dape_tile.leaky(_hidden(x, flat, w, n))
    logits = [out + w(flat.w_out(n, h)) * a for h, out in enumerate(logits)]
  return logits


def mlp_backward(da_list, s_list, b_list, flat: dape_tile.FlatParams, w, *, grads: bool):
  """(ds [H], db [H] of [q, k], gradient terms) from the logits' cotangents dA [H] of [q, k]
  (zero at masked pairs). The terms: (packed index, float32 scalar) pairs, the tile's sums
  d w_in, d b_in, d w_out, d b_out (empty unless `grads`; the bias parameters' come from
  `TileBias.param_grad_tiles` of db)."""
  x = features(s_list, b_list, flat)
  h_count = flat.heads
  dx = [jnp.zeros_like(da_list[0]) for _ in range(flat.features)]
  terms = []
  for n in range(flat.hidden):
    z = _hidden(x, flat, w, n)
    da = w(flat.w_out(n, 0)) * da_list[0]
    for h in range(1, h_count):
      da = da + w(flat.w_out(n, h)) * da_list[h]
    dz = jnp.where(z >= 0, da, dape_tile.LEAKY * da)
    dx = [d + w(flat.w_in(c, n)) * dz for c, d in enumerate(dx)]
    if grads:
      terms += [(flat.w_in(c, n), jnp.sum(x[c] * dz)) for c in range(flat.features)]
      terms.append((flat.b_in(n), jnp.sum(dz)))
      a = dape_tile.leaky(z)
      terms += [(flat.w_out(n, h), jnp.sum(a * da_list[h])) for h in range(h_count)]
  if grads:
    terms += [(flat.b_out(h), jnp.sum(da_list[h])) for h in range(h_count)]
  ds = [da + dx[h] for h, da in enumerate(da_list)]
  db = [da + dx[h_count + h] if flat.uses_bias_features else da
        for h, da in enumerate(da_list)]
  return ds, db, terms


def grad_vector(terms, size: int):
  """float32 [size] holding the scalars of `terms` ((index, value) pairs) at their indices."""
  index = jax.lax.broadcasted_iota(jnp.int32, (size,), 0)
  out = jnp.zeros((size,), jnp.float32)
  for i, value in terms:
    out = out + jnp.where(index == i, value, 0.0)
  return out
