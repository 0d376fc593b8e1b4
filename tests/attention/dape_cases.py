"""The inputs both fused-DAPE kernel tests draw (tests/attention/test_pallas_dape.py, TPU;
test_pallas_gpu_dape.py, GPU): DAPE V1's parameters and a static bias case."""

import functools

import jax.numpy as jnp

from bipe_jax.attention.pallas.tile_bias import TileBias
from bipe_jax.encodings import alibi
from bipe_jax.encodings import kerple


def dape_params(rng, features: int, hidden: int, heads: int) -> dict:
  """DAPE V1's 'w_in' [features, hidden], 'b_in', 'w_out' [hidden, heads], 'b_out', drawn."""
  shapes = dict(w_in=(features, hidden), b_in=(hidden,), w_out=(hidden, heads), b_out=(heads,))
  return {name: jnp.asarray(rng.normal(size=shape) * 0.5, jnp.float32)
          for name, shape in shapes.items()}


def bias_case(rng, kind: str, heads: int) -> tuple:
  """(TileBias, raw bias parameters, raw -> kernel params [H, P], raw -> bias_fn) of 'kerple'
  (p of head 0 below the clamp: its straight-through gradient is checked) or 'alibi'."""
  if kind == 'kerple':
    raw = dict(p=jnp.asarray(rng.uniform(0.0, 2.0, heads), jnp.float32).at[0].set(0.005),
               a=jnp.asarray(rng.uniform(0.0, 1.0, heads), jnp.float32))
    clamped = lambda r: [kerple.clamp_straight_through(r[n], kerple.KERPLE_MIN) for n in 'pa']
    return (TileBias('kerple'), raw, lambda r: jnp.stack(clamped(r), axis=1),
            lambda r: lambda qs, ks: kerple.kerple_log_bias(qs, ks, *clamped(r)))
  slopes = alibi.alibi_slopes(heads)
  return (TileBias('alibi'), {}, lambda r: jnp.asarray(slopes, jnp.float32)[:, None],
          lambda r: functools.partial(alibi.alibi_bias, slopes_H=slopes, slope_factor=1.0))
