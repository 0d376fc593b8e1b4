"""The language-model head and the next-token loss together, a chunk of positions at a time.

The plain loss materialises the logits [B, T, V] (float32), then a softmax pass, then the
gradient pass (softmax - one_hot) over all of them, then the two head matmuls of the backward
pass read them again. `lm_head_nll_sum` computes, for one chunk of positions at a time, the
logits, the loss and already the gradients of the head (dhidden, dkernel): the chunk's logits
never leave the cache, and the backward pass only scales the stored gradients by the incoming
cotangent. Same three matmuls as the plain loss, no [B, T, V] array at all (the memory of the
logits on an accelerator becomes the memory of one chunk).

Measured on this project's 2-core CPU (one thread, 2,048 tokens, width 128, vocab 4,096; value
and gradients of the head plus loss; benchmarks/head_and_weight_gradient.py): 125.5 ms with the
logits materialised, 79.1 ms in chunks of 512 tokens, 83.5 at 256, 95.8 at 1,024.

Chunks are cut along the sequence axis, so the batch axis (the one sharded over the data /
fsdp mesh axes) is never split or merged across shards: each step of the scan sees
[B, Tc] positions, every data shard B/shards rows of them.
"""

import functools

import jax
import jax.numpy as jnp

from bipe_jax import kernels as kernels_lib
from bipe_jax import loop_unroll


def chunk_length(rows_per_shard: int, seq_len: int, chunk_tokens: int) -> int:
  """Positions per chunk: the largest divisor Tc of `seq_len` with rows_per_shard * Tc <=
  chunk_tokens (at least 1), i.e. at most `chunk_tokens` logits rows per device and chunk."""
  if seq_len < 1 or rows_per_shard < 1 or chunk_tokens < 1:
    raise ValueError(f'chunk_length: rows_per_shard={rows_per_shard}, seq_len={seq_len}, '
                     f'chunk_tokens={chunk_tokens} must all be >= 1')
  best = 1
  for tc in range(1, seq_len + 1):
    if seq_len % tc == 0 and rows_per_shard * tc <= chunk_tokens:
      best = tc
  return best


def _to_chunks(x_BxT_, tc: int) -> jax.Array:
  """[B, T, ...] -> [T / tc, B, tc, ...] (the scan axis first, the batch axis kept whole)."""
  b, t = x_BxT_.shape[:2]
  x = x_BxT_.reshape(b, t // tc, tc, *x_BxT_.shape[2:])
  return jnp.swapaxes(x, 0, 1)


def _from_chunks(x_NxBxTc_) -> jax.Array:
  """[N, B, tc, ...] -> [B, N * tc, ...] (inverse of _to_chunks)."""
  x = jnp.swapaxes(x_NxBxTc_, 0, 1)
  return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _checked_chunks(hidden_BxTxD, targets_BxT, weights_BxT, chunk_len) -> tuple:
  """Checks the inputs; returns (hidden, targets, weights) as chunks for the scan, each chunk
  flat: [N, B * Tc, D], [N, B * Tc], [N, B * Tc] float32 (N = T / chunk_len)."""
  _check(hidden_BxTxD, targets_BxT, weights_BxT, chunk_len)
  flat = lambda x: _to_chunks(x, chunk_len).reshape(
      hidden_BxTxD.shape[1] // chunk_len, -1, *x.shape[2:])
  return flat(hidden_BxTxD), flat(targets_BxT), flat(weights_BxT.astype(jnp.float32))


def _chunk_logits(h_NxD, kernel_DxV, dtype) -> jax.Array:
  """float32 logits [N, V] of one chunk, computed in `dtype` as the model's head does."""
  return (h_NxD.astype(dtype) @ kernel_DxV.astype(dtype)).astype(jnp.float32)


def _chunk_nll(logits_NxV, targets_N):
  """(-log softmax(logits)[target] [N], exp(logits - max) [N, V], their row sums [N, 1])."""
  top = jnp.max(logits_NxV, axis=-1, keepdims=True)
  e = jnp.exp(logits_NxV - top)
  total = jnp.sum(e, axis=-1, keepdims=True)
  target_logit = jnp.take_along_axis(logits_NxV, targets_N[:, None], axis=-1)[:, 0]
  return (top[:, 0] + jnp.log(total[:, 0])) - target_logit, e, total


def lm_head_nll_sum(hidden_BxTxD: jax.Array, kernel_DxV: jax.Array, targets_BxT: jax.Array,
                    weights_BxT: jax.Array, chunk_len: int, dtype=jnp.float32,
                    kernels: str = 'auto') -> jax.Array:
  """sum over b, t of weights[b, t] * -log softmax(hidden[b, t] @ kernel)[targets[b, t]].

  float32 scalar. The matmul runs in `dtype` (the model's compute dtype), the softmax in
  float32; `chunk_len` positions (a divisor of T, see `chunk_length`) are done at a time.
  Differentiable in hidden, kernel and (floating-point) weights; targets are integer ids.
  `kernels`: the path (bipe_jax.kernels) whose form the kernel's gradient h^T @ d_logits takes.
  Inside `jax.shard_map` the kernel and weights are first made to vary over the mesh axes
  the hidden states vary over, so the kernel's gradient is summed over them (JAX's rule for a
  replicated operand), as for a plain `hidden @ kernel`.
  """
  kernel_DxV, weights_BxT = (_varying_like(x, hidden_BxTxD) for x in (kernel_DxV, weights_BxT))
  return _nll_sum(hidden_BxTxD, kernel_DxV, targets_BxT, weights_BxT, chunk_len, dtype, kernels)


def _varying_like(x: jax.Array, like: jax.Array) -> jax.Array:
  """`x` made to vary over the shard_map axes `like` varies over: adding a zero that varies
  as `like` does lets JAX insert the cast (outside shard_map XLA folds the + 0 away)."""
  return x + jnp.zeros_like(like, x.dtype, shape=())


def _zeros_varying_like(shape: tuple, like: jax.Array) -> jax.Array:
  """float32 zeros that vary over the shard_map axes `like` varies over (plain zeros outside
  one): a scan carry keeps one type through the loop."""
  return jnp.zeros_like(like, jnp.float32, shape=shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _nll_sum(hidden_BxTxD, kernel_DxV, targets_BxT, weights_BxT, chunk_len, dtype, kernels):
  return _forward(hidden_BxTxD, kernel_DxV, targets_BxT, weights_BxT, chunk_len, dtype,
                  kernels)[0]


def _check(hidden_BxTxD, targets_BxT, weights_BxT, chunk_len):
  if hidden_BxTxD.ndim != 3 or targets_BxT.shape != hidden_BxTxD.shape[:2] or (
      weights_BxT.shape != targets_BxT.shape):
    raise ValueError(f'lm_head_nll_sum: hidden [B, T, D], targets and weights [B, T]; got '
                     f'{hidden_BxTxD.shape}, {targets_BxT.shape}, {weights_BxT.shape}')
  if not jnp.issubdtype(weights_BxT.dtype, jnp.floating):
    raise ValueError(f'lm_head_nll_sum: weights must be floating point, got {weights_BxT.dtype}')
  if hidden_BxTxD.shape[1] % chunk_len:
    raise ValueError(f'lm_head_nll_sum: chunk_len={chunk_len} does not divide the sequence '
                     f'length {hidden_BxTxD.shape[1]}')


def _forward(hidden, kernel, targets, weights, chunk_len, dtype, kernels):
  """The loss alone (no gradients): what runs when nothing differentiates it."""
  del kernels

  def body(total, chunk):
    h, tgt, w = chunk
    nll, _, _ = _chunk_nll(_chunk_logits(h, kernel, dtype), tgt)
    return total + jnp.sum(nll * w), None

  chunks = _checked_chunks(hidden, targets, weights, chunk_len)
  total, _ = jax.lax.scan(body, _zeros_varying_like((), hidden), chunks,
                          unroll=loop_unroll.scan_unroll())
  return total, None


def _forward_with_gradients(hidden, kernel, targets, weights, chunk_len, dtype, kernels):
  b, t = targets.shape
  vocab = kernel.shape[-1]
  kernel_c = kernel.astype(dtype)
  path = kernels_lib.select(kernels)

  def body(carry, chunk):
    total, d_kernel = carry
    h, extra, tgt, w = chunk
    h_c = h.astype(dtype)
    nll, e, row_sum = _chunk_nll(_chunk_logits(h_c, kernel_c, dtype), tgt)
    # d(sum w * nll) / dlogits = w * (softmax - one_hot), in one pass over the chunk
    d_logits = ((e / row_sum - (jnp.arange(vocab) == tgt[:, None])) * w[:, None]).astype(dtype)
    d_h = (d_logits @ kernel_c.T).astype(hidden.dtype)
    d_kernel = d_kernel + path.lm_head_kernel_gradient(h_c, extra, d_logits)
    return (total + jnp.sum(nll * w), d_kernel), (d_h, nll)

  h_chunks, t_chunks, w_chunks = _checked_chunks(hidden, targets, weights, chunk_len)
  # What else the kernel's gradient reads per chunk is the path's (on CPU: a transposed copy).
  extra_chunks = path.lm_head_scan_inputs(h_chunks)
  init = (_zeros_varying_like((), hidden), _zeros_varying_like(kernel.shape, hidden))
  (total, d_kernel), (d_hidden, nll) = jax.lax.scan(
      body, init, (h_chunks, extra_chunks, t_chunks, w_chunks),
      unroll=loop_unroll.scan_unroll())
  unflat = lambda x: _from_chunks(x.reshape(t // chunk_len, b, chunk_len, *x.shape[2:]))
  return total, (unflat(d_hidden), d_kernel.astype(kernel.dtype),
                 unflat(nll).astype(weights.dtype))


def _backward(chunk_len, dtype, kernels, residuals, g):
  del chunk_len, dtype, kernels
  d_hidden, d_kernel, nll = residuals
  return (d_hidden * g.astype(d_hidden.dtype), d_kernel * g.astype(d_kernel.dtype), None,
          nll * g.astype(nll.dtype))


_nll_sum.defvjp(_forward_with_gradients, _backward)
