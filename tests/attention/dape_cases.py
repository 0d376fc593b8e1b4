"""The inputs both fused-DAPE kernel tests draw (tests/attention/test_pallas_dape.py, TPU;
test_pallas_gpu_dape.py, GPU): DAPE V1's parameters and a static bias case."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

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


def assert_gradients_equal(label: str, got: tuple, want: tuple) -> None:
  """The kernel's gradients (of q, k, v, the DAPE parameters and the bias parameters) equal
  dense DAPE's within 1e-5 relative to the largest gradient of each group: float32 sums over
  many pairs (d b_out is exactly 0, the softmax being shift-invariant per head, so both sides
  give rounding noise there)."""
  for name, a, b in zip(['q', 'k', 'v', 'dape', 'bias'], got, want, strict=True):
    scale = max([1.0] + [float(jnp.max(jnp.abs(y))) for y in jax.tree.leaves(b)])
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b),
                            strict=True):
      np.testing.assert_allclose(x / scale, y / scale, atol=1e-5, rtol=0,
                                 err_msg=f'{label}: d {name}{jax.tree_util.keystr(path)}')
