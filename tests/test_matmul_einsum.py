"""model.matmul_einsum equals jnp.einsum for every projection equation of the model."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from bipe_jax.model import matmul_einsum

CASES = [
    ('btd,dhk->bhtk', (2, 5, 8), (8, 3, 4)),
    ('btd,dgk->bgtk', (2, 5, 8), (8, 1, 4)),
    ('bhtk,hkd->btd', (2, 3, 5, 4), (3, 4, 8)),
    ('btd,df->btf', (2, 5, 8), (8, 6)),
    ('btf,fd->btd', (2, 5, 6), (6, 8)),
    ('btf,fd->btd', (2, 5, 12), (12, 4)),  # wider in than out: matmul_2d's CPU weight gradient
]


@pytest.mark.parametrize('equation,x_shape,w_shape', CASES)
def test_matches_einsum_values_and_gradients(equation, x_shape, w_shape):
  kx, kw = jax.random.split(jax.random.PRNGKey(0))
  x = jax.random.normal(kx, x_shape)
  w = jax.random.normal(kw, w_shape)
  np.testing.assert_allclose(matmul_einsum(equation, x, w), jnp.einsum(equation, x, w),
                             rtol=1e-5, atol=1e-5)
  g_ref = jax.grad(lambda x, w: jnp.sum(jnp.sin(jnp.einsum(equation, x, w))), (0, 1))(x, w)
  g = jax.grad(lambda x, w: jnp.sum(jnp.sin(matmul_einsum(equation, x, w))), (0, 1))(x, w)
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_forward_mode_and_second_order_autodiff_still_work():
  """matmul_2d's custom rule is a JVP: jvp, and a Hessian-vector product, equal plain einsum's."""
  kx, kw, kv = jax.random.split(jax.random.PRNGKey(1), 3)
  x, w, v = jax.random.normal(kx, (2, 5, 12)), jax.random.normal(kw, (12, 4)), jax.random.normal(
      kv, (12, 4))
  f = lambda w: jnp.sum(jnp.tanh(matmul_einsum('btf,fd->btd', x, w)) ** 2)
  f_ref = lambda w: jnp.sum(jnp.tanh(jnp.einsum('btf,fd->btd', x, w)) ** 2)
  np.testing.assert_allclose(jax.jvp(f, (w,), (v,))[1], jax.jvp(f_ref, (w,), (v,))[1],
                             rtol=1e-5)
  hvp = lambda fn: jax.jvp(jax.grad(fn), (w,), (v,))[1]
  np.testing.assert_allclose(hvp(f), hvp(f_ref), rtol=1e-4, atol=1e-5)


def test_wide_in_kernels_get_the_transposed_weight_gradient_on_cpu():
  """The compiled gradient of a K > M kernel computes dy^T x (a [M, K] dot) and transposes it."""
  x, w = jnp.ones((64, 12)), jnp.ones((12, 4))
  hlo = jax.jit(jax.grad(lambda w: jnp.sum(matmul_einsum('btf,fd->btd', x[None], w) ** 2))
                ).lower(w).compile().as_text()
  assert 'f32[4,12]' in hlo and 'transpose' in hlo
