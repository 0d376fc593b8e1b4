"""bipe_jax.kernels.cpu_matmul (the cpu path's projections): matmul_einsum equals jnp.einsum
for every projection equation of the model; matmul_2d's weight-gradient primitive keeps every autodiff mode and vmap working, and keeps
data-parallel weight gradients in the kernel's layout."""

import os
import subprocess
import sys

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from bipe_jax.kernels.cpu_matmul import matmul_2d
from bipe_jax.kernels.cpu_matmul import matmul_einsum
from tests import fixtures

ROOT = fixtures.ROOT

CASES = [
    ('btd,dhk->bhtk', (2, 5, 8), (8, 3, 4)),
    ('btd,dgk->bgtk', (2, 5, 8), (8, 1, 4)),
    ('bhtk,hkd->btd', (2, 3, 5, 4), (3, 4, 8)),
    ('btd,df->btf', (2, 5, 8), (8, 6)),
    ('btf,fd->btd', (2, 5, 6), (6, 8)),
    ('btf,fd->btd', (2, 5, 12), (12, 4)),  # wider in than out
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
  """matmul_2d's rule is a JVP whose weight term is a bilinear primitive: jvp, Hessian-vector
  products in either argument, gradients of gradients and remat equal plain einsum's."""
  kx, kw, kv = jax.random.split(jax.random.PRNGKey(1), 3)
  x, w, v = jax.random.normal(kx, (2, 5, 12)), jax.random.normal(kw, (12, 4)), jax.random.normal(
      kv, (12, 4))
  f = lambda x, w: jnp.sum(jnp.tanh(matmul_einsum('btf,fd->btd', x, w)) ** 2)
  f_ref = lambda x, w: jnp.sum(jnp.tanh(jnp.einsum('btf,fd->btd', x, w)) ** 2)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  for fn in (f, f_ref):
    assert fn(x, w).shape == ()
  close(jax.jvp(lambda w: f(x, w), (w,), (v,))[1], jax.jvp(lambda w: f_ref(x, w), (w,), (v,))[1])
  hvp_w = lambda fn: jax.jvp(jax.grad(lambda w: fn(x, w)), (w,), (v,))[1]
  close(hvp_w(f), hvp_w(f_ref))
  hvp_x = lambda fn: jax.jvp(jax.grad(lambda x: fn(x, w)), (x,), (0.3 * x,))[1]
  close(hvp_x(f), hvp_x(f_ref))
  grad_of_grad = lambda fn: jax.grad(lambda x: jnp.sum(jax.grad(fn, 1)(x, w) ** 2))(x)
  close(grad_of_grad(f), grad_of_grad(f_ref))
  close(jax.grad(jax.checkpoint(f), 1)(x, w), jax.grad(f_ref, 1)(x, w))
  # reverse over forward: the primitive's derivative in x (its transpose for x)
  jvp_w = lambda fn: (lambda x: jax.jvp(lambda w: fn(x, w), (w,), (v,))[1])
  close(jax.grad(jvp_w(f))(x), jax.grad(jvp_w(f_ref))(x))


def test_vmap_of_gradients_and_of_forward_mode():
  """vmap over a batch of (x, w) pairs, of the gradient and of a Hessian-vector product."""
  kx, kw = jax.random.split(jax.random.PRNGKey(2))
  xs, ws = jax.random.normal(kx, (3, 6, 5)), jax.random.normal(kw, (3, 5, 4))
  f = lambda x, w: jnp.sum(jnp.sin(matmul_2d(x, w)) ** 2)
  f_ref = lambda x, w: jnp.sum(jnp.sin(x @ w) ** 2)
  for argnums in (0, 1, (0, 1)):
    got = jax.jit(jax.vmap(jax.grad(f, argnums)))(xs, ws)
    want = jax.vmap(jax.grad(f_ref, argnums))(xs, ws)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  hvp = lambda fn: jax.vmap(lambda x, w: jax.jvp(jax.grad(fn, 1), (x, w), (x, 2 * w))[1])(xs, ws)
  np.testing.assert_allclose(hvp(f), hvp(f_ref), rtol=1e-4, atol=1e-5)
  # vmap of forward mode binds the primitive on batched operands (its batching rule)
  jvp = lambda fn: jax.vmap(lambda x, w: jax.jvp(lambda w: fn(x, w), (w,), (0.5 * w,))[1])
  np.testing.assert_allclose(jvp(f)(xs, ws), jvp(f_ref)(xs, ws), rtol=1e-5, atol=1e-5)
  shared_w = jax.vmap(jax.grad(f, 1), in_axes=(0, None))(xs, ws[0])  # only x mapped
  np.testing.assert_allclose(shared_w, jax.vmap(jax.grad(f_ref, 1), in_axes=(0, None))(
      xs, ws[0]), rtol=1e-5, atol=1e-5)


def test_data_parallel_weight_gradients_are_summed_in_the_kernel_layout():
  """Two data-parallel CPU devices: the all-reduce sums the weight gradient as [K, M] (the
  kernel's layout, cpu_matmul's primitive); JAX's own rule sums dot(dy, x) [M, K] and
  transposes after it, which the same check sees."""
  code = (
      'import jax, jax.numpy as jnp, numpy as np\n'
      'jax.config.update("jax_num_cpu_devices", 2)\n'
      'from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n'
      'from bipe_jax.kernels.cpu_matmul import matmul_2d\n'
      'mesh = Mesh(np.array(jax.devices()), ("data",))\n'
      'x = jax.device_put(jax.random.normal(jax.random.PRNGKey(0), (64, 12)),\n'
      '                   NamedSharding(mesh, P("data")))  # rows split over the devices\n'
      'w = jax.device_put(jnp.ones((12, 4)), NamedSharding(mesh, P()))\n'
      'for name, mm in (("ours", matmul_2d), ("jax", jnp.matmul)):\n'
      '  g = jax.jit(jax.grad(lambda w, x: jnp.sum(jnp.tanh(mm(x, w)))),\n'
      '              out_shardings=NamedSharding(mesh, P()))\n'
      '  hlo = g.lower(w, x).compile().as_text()\n'
      '  lines = [l for l in hlo.splitlines() if "all-reduce(" in l]\n'
      '  print(name, len(lines), "f32[12,4]" in lines[0], "f32[4,12]" in lines[0])\n')
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', 'NPROC')}
  proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.split('\n')[:2] == ['ours 1 True False', 'jax 1 False True'], proc.stdout
