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
