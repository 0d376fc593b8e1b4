"""The per-tile pieces of the GPU (Triton) kernels: loads of the side arrays and a tile's logits.

Triton programs cannot slice a loaded array, so each row of the int side arrays
(bipe_jax.attention.pallas.layout: q_info [B, Tq, INFO], k_info [B, INFO, Tk]) is loaded on its own, and
the bias parameters of a head are read one scalar at a time (`TileBias.bias_from`). Queries are
rows and keys columns: a query tile's fields come as [q, 1] columns, a key tile's as [1, k] rows,
so they broadcast to [q, k] without a transpose.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from bipe_jax.kernels.gqa_products import NEG_INF
from bipe_jax.attention.pallas import layout

TRANS_B = (((1,), (1,)), ((), ()))  # a [m, d] . b [n, d] -> [m, n]
TRANS_A = (((0,), (0,)), ((), ()))  # a [d, m] . b [d, n] -> [m, n]


def query_fields(qi_ref, rows):
  """(causal index, bias stream, document) int32 [q, 1] of the query rows `rows` (a pl.ds)."""
  return tuple(qi_ref[rows, field][:, None] for field in (layout.POS, layout.STREAM, layout.DOC))


def key_fields(ki_ref, cols):
  """(causal index, bias stream, document, validity) int32 [1, k] of the key columns `cols`."""
  return tuple(ki_ref[field, cols][None, :]
               for field in (layout.POS, layout.STREAM, layout.DOC, layout.VALID))


def visible(q_fields, k_fields, causal: bool):
  """bool [q, k]: a valid key of the query's document, and (causal) k_pos <= q_pos."""
  q_pos, _, q_doc = q_fields
  k_pos, _, k_doc, k_valid = k_fields
  vis = (k_valid != 0) & (q_doc == k_doc)
  if causal:
    vis = vis & (k_pos <= q_pos)
  return vis


def tile_logits(q, k, q_fields, k_fields, param, *, tile_bias, scale: float, causal: bool):
  """(masked logits float32 [q, k], visible bool [q, k]) of q [q, Dh] against k [k, Dh]."""
  s = jax.lax.dot_general(q, k, TRANS_B, preferred_element_type=jnp.float32) * scale
  bias = tile_bias.bias_from(param, q_fields[1], k_fields[1])
  if bias is not None:
    s = s + bias
  vis = visible(q_fields, k_fields, causal)
  return jnp.where(vis, s, NEG_INF), vis


def maybe(run: bool, pred, compute, carry):
  """compute(carry) when `pred` (a traced bool) holds, else carry; always when `run` is False
  (no causal skipping)."""
  if not run:
    return compute(carry)
  return jax.lax.cond(pred, compute, lambda c: c, carry)
