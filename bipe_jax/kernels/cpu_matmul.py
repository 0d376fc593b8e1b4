"""The cpu path's projections: 2-D matmuls whose weight gradient keeps the kernel's layout.

`matmul_2d(x [N, K], w [K, M])` is x @ w. Differentiated by JAX's own rules, the weight
gradient comes out as dot(dy, x) [M, K] followed by a transpose. On one device XLA folds that
transpose into the matmul; under data parallelism the partial gradients are summed across
devices (an all-reduce) between the two, so the transpose stays and lands in the optimizer's
elementwise update, which then reads every such gradient column by column. On the project's
CPU host (two data-parallel devices, width 512, FFN 2,048) the optimizer took 137 ms a step
instead of 40 and the whole step 1.13x as long (benchmarks/README.md).

Here the weight term of the derivative is the primitive `weight_term_p` (x @ dw, bilinear),
whose transpose computes the weight gradient as x^T @ dy: a [K, M] matmul in the kernel's
own layout, summed across devices as it is. The rule is part of a custom JVP, so forward-mode
autodiff (jvp, Hessian-vector products) and vmap keep working. It uses internal JAX APIs and
has no varying-axes rule, so `jax.grad` through it inside `jax.shard_map` (check_vma=True)
fails: the portable path (kernels/portable.py) projects with a plain einsum instead.

`matmul_einsum` runs the model's projection einsums ('btd,dhk->bhtk', ...) as one
`matmul_2d`.
"""

import math

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import ad
from jax.interpreters import batching
from jax.interpreters import mlir


def _plain_product(x_NxK: jax.Array, dw_KxM: jax.Array) -> jax.Array:
  return jnp.matmul(x_NxK, dw_KxM)


weight_term_p = core.Primitive('bipe_weight_term')
weight_term_p.def_impl(_plain_product)
weight_term_p.def_abstract_eval(
    lambda x, dw: jax.core.ShapedArray((x.shape[0], dw.shape[1]), jnp.result_type(x, dw)))
mlir.register_lowering(weight_term_p, mlir.lower_fun(_plain_product, multiple_results=False))


def _transpose_for_x(ct_NxM, x, dw_KxM):
  del x
  return jnp.matmul(ct_NxM, dw_KxM.T)


def _transpose_for_w(ct_NxM, x_NxK, dw):
  del dw
  return jnp.matmul(x_NxK.T, ct_NxM)  # [K, M]: the kernel's layout, no transpose after it


# Bilinear: jvp(x, dw) = term(dx, dw) + term(x, ddw); each factor's transpose as above.
ad.defbilinear(weight_term_p, _transpose_for_x, _transpose_for_w)


def _batched_weight_term(args, dims):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)  # None: not mapped
  x, dw = (batching.bdim_at_front(a, d, size) for a, d in zip(args, dims))
  return jnp.einsum('bnk,bkm->bnm', x, dw), 0


batching.primitive_batchers[weight_term_p] = _batched_weight_term


@jax.custom_jvp
def matmul_2d(x_NxK: jax.Array, w_KxM: jax.Array) -> jax.Array:
  """x @ w [N, M], with the weight term of its derivative computed by `weight_term_p` (see the
  module docstring). Values and gradients are those of x @ w."""
  return x_NxK @ w_KxM


@matmul_2d.defjvp
def _matmul_2d_jvp(primals, tangents):
  x, w = primals
  dx, dw = tangents
  return x @ w, dx @ w + weight_term_p.bind(x, dw)


def matmul_einsum(equation: str, x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`jnp.einsum(equation, x, kernel)` computed as ONE 2-D matmul.

  For the projections of this model (the kernel's contracted axes lead, e.g. 'btd,dhk->bhtk',
  'bhtk,hkd->btd'): x is transposed so its free axes lead and its contracted axes trail, both
  sides are flattened to [N, C] @ [C, M], and the result is reshaped / transposed to the
  output. XLA CPU runs the 2-D form ~1.9x faster forward + backward than the 3-D einsum,
  whose weight gradient it lays out transposed (measured in benchmarks/README.md); the 2-D
  matmul is `matmul_2d`.
  """
  inputs, out = equation.split('->')
  xs, ws = inputs.split(',')
  contracted = [c for c in ws if c in xs and c not in out]
  if ws[:len(contracted)] != ''.join(contracted) or any(c in ws for c in out if c in xs):
    return jnp.einsum(equation, x, kernel)  # not of the supported form
  x_free = [c for c in out if c in xs]
  w_free = list(ws[len(contracted):])
  perm = [xs.index(c) for c in x_free + contracted]
  if perm != list(range(x.ndim)):
    x = jnp.transpose(x, perm)
  sizes = {c: x.shape[i] for i, c in enumerate(x_free + contracted)}
  sizes.update({c: kernel.shape[i] for i, c in enumerate(ws)})
  n = math.prod(sizes[c] for c in x_free)
  k = math.prod(sizes[c] for c in contracted)
  y = matmul_2d(x.reshape(n, k), kernel.reshape(k, -1)).reshape(
      [sizes[c] for c in x_free + w_free])
  current = x_free + w_free
  perm_out = [current.index(c) for c in out]
  return y if perm_out == list(range(len(out))) else jnp.transpose(y, perm_out)
