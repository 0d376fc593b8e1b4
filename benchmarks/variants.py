"""Benchmark-only variants of the model and loss, patched in to measure proposed changes.

Each variant is a context manager that swaps one piece of bipe_jax for an equivalent
formulation (same parameters, same results up to float rounding) while a step is traced,
so benchmarks can time the project's real training step with and without the change:

  flat_projections   `model.Projection` computes its einsum as ONE 2-D matmul: the
                     activation is transposed so its free axes lead, reshaped to
                     [N, contracted], multiplied by the kernel reshaped to
                     [contracted, out], and reshaped/transposed back. On XLA CPU the
                     3-D einsum's backward produces transposed copies (the SwiGLU
                     backward fusion writes [F, B*T]) that cost more than the matmuls.
  roll_loss          `train_step.next_token_nll` scores all T positions against
                     tokens rolled by one, masking the last column, instead of slicing
                     logits[:, :-1] (a copy of the [B, T-1, V] logits forward and a pad
                     of their gradient backward).

  fast_attention     `attention.dense_attention` with the row max under
                     `lax.stop_gradient` (exact: softmax does not depend on the shift;
                     differentiating jnp.max costs a select-scatter over [B, H, Q, K]) and
                     the GQA einsums as 4-D batched matmuls over (B, G) with the R = H / G
                     query heads of a group merged into the query axis
                     ('bgxd,bgkd->bgxk', x = R*Q) instead of 5-D 'bgrqd,bgkd->bgrqk'.

`VARIANTS` maps names to context managers; `patched(names)` enters several.
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def flat_einsum(equation: str, x, kernel):
  """einsum(equation, x, kernel) as one 2-D matmul (kernel's contracted axes lead)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  ins, out = equation.split('->')
  xs, ws = ins.split(',')
  contracted = [c for c in ws if c in xs and c not in out]
  if ws[:len(contracted)] != ''.join(contracted):
    return jnp.einsum(equation, x, kernel)  # not of the supported form
  x_free = [c for c in out if c in xs]
  w_free = [c for c in ws if c not in contracted]
  perm = [xs.index(c) for c in x_free + contracted]
  xt = jnp.transpose(x, perm) if perm != list(range(x.ndim)) else x
  sizes = dict(zip(xs, x.shape)) | dict(zip(ws, kernel.shape))
  n = 1
  for c in x_free:
    n *= sizes[c]
  k = 1
  for c in contracted:
    k *= sizes[c]
  y = xt.reshape(n, k) @ kernel.reshape(k, -1)
  y = y.reshape([sizes[c] for c in x_free + w_free])
  cur = x_free + w_free
  perm_out = [cur.index(c) for c in out]
  return jnp.transpose(y, perm_out) if perm_out != list(range(len(out))) else y


@contextlib.contextmanager
def flat_projections():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  original = model_lib.Projection

  class FlatProjection(original):
    """Projection with the same parameter, computed by `flat_einsum`."""

    @nn.compact
    def __call__(self, x):
      kernel = self.param('kernel', nn.with_logical_partitioning(model_lib._INIT, self.axes),  # pylint: disable=protected-access
                          self.shape, 'float32')
      return flat_einsum(self.equation, x.astype(self.dtype), kernel.astype(self.dtype))

  FlatProjection.__name__ = 'Projection'
  model_lib.Projection = FlatProjection
  try:
    yield
  finally:
    model_lib.Projection = original


@contextlib.contextmanager
def roll_loss():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import train_step  # pylint: disable=g-import-not-at-top
  original = train_step.next_token_nll

  def next_token_nll(logits_BxTxV, tokens_BxT, pad_id=-1):
    import jax  # pylint: disable=g-import-not-at-top
    logits = logits_BxTxV.astype(jnp.float32)
    targets = jnp.roll(tokens_BxT, -1, axis=1)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    valid = jnp.arange(tokens_BxT.shape[1])[None, :] < tokens_BxT.shape[1] - 1
    if pad_id >= 0:
      valid = valid & (targets != pad_id)
    valid = jnp.broadcast_to(valid, targets.shape)
    return (jnp.sum(jnp.where(valid, log_z - target_logit, 0.0)),
            jnp.sum(valid).astype(jnp.float32))

  train_step.next_token_nll = next_token_nll
  try:
    yield
  finally:
    train_step.next_token_nll = original


def _scores_4d(q_BxHxQxDh, k_BxGxKxDh, scale):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  b, h, nq, d = q_BxHxQxDh.shape
  g, nk = k_BxGxKxDh.shape[1], k_BxGxKxDh.shape[2]
  q4 = (q_BxHxQxDh * jnp.asarray(scale, q_BxHxQxDh.dtype)).reshape(b, g, (h // g) * nq, d)
  s = jnp.einsum('bgxd,bgkd->bgxk', q4, k_BxGxKxDh, preferred_element_type=jnp.float32)
  return s.reshape(b, h, nq, nk)


def _values_4d(p_BxHxQxK, v_BxGxKxDh):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  b, h, nq, nk = p_BxHxQxK.shape
  g, d = v_BxGxKxDh.shape[1], v_BxGxKxDh.shape[3]
  p4 = p_BxHxQxK.reshape(b, g, (h // g) * nq, nk).astype(v_BxGxKxDh.dtype)
  o = jnp.einsum('bgxk,bgkd->bgxd', p4, v_BxGxKxDh, preferred_element_type=jnp.float32)
  return o.reshape(b, h, nq, d)


@contextlib.contextmanager
def fast_attention():
  import math  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bipe_jax import attention as att  # pylint: disable=g-import-not-at-top
  saved = (att.dense_attention, att.attention_scores, att._weighted_values)  # pylint: disable=protected-access

  def dense_attention(q, k, v, *, q_pos, k_pos, q_streams=None, k_streams=None, bias_fn=None,
                      transform_fn=None, k_valid=None, q_document=None, k_document=None,
                      mask_fn=None, causal=True, scale=None, k_in_range=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if q_streams is None:
      q_streams, k_streams = q_pos, k_pos
    if k_in_range is None:
      k_in_range = jnp.ones(k_pos.shape, bool)
    logits = att._block_logits(q, k, q_pos, k_pos, q_streams, k_streams, k_in_range,  # pylint: disable=protected-access
                               scale=scale, bias_fn=bias_fn, transform_fn=transform_fn)
    vis = att._visible(q_pos, k_pos, causal, k_valid, q_document, k_document, mask_fn,  # pylint: disable=protected-access
                       q_streams, k_streams)
    logits = jnp.where(vis, logits, att.NEG_INF)
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    p = jnp.where(vis, jnp.exp(logits - m), 0.0)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = _values_4d(p, v) / jnp.where(denom == 0.0, 1.0, denom)
    return out.astype(q.dtype)

  att.dense_attention, att.attention_scores, att._weighted_values = (  # pylint: disable=protected-access
      dense_attention, _scores_4d, _values_4d)
  try:
    yield
  finally:
    att.dense_attention, att.attention_scores, att._weighted_values = saved  # pylint: disable=protected-access


VARIANTS = {'flat_projections': flat_projections, 'roll_loss': roll_loss,
            'fast_attention': fast_attention}


@contextlib.contextmanager
def patched(names):
  """Enters the variants named in `names` (an iterable of VARIANTS keys)."""
  with contextlib.ExitStack() as stack:
    for n in names:
      if n not in VARIANTS:
        raise ValueError(f'unknown variant {n!r}; known: {sorted(VARIANTS)}')
      stack.enter_context(VARIANTS[n]())
    yield
