"""`AttentionMask`: which (query, key) pairs may attend, as one value every attention takes.

Fields (arrays are pytree leaves; `causal` and `mask_fn` are static, part of the tree's shape):
  q_pos [B, Q], k_pos [B, K]   int causal indices: the token's index in its row, or its cache
                               slot while decoding.
  k_valid [B, K] | None        bool, False for padding keys (None: every key is real).
  q_document [B, Q] | None,    int document ids of packed rows (None: no document mask);
  k_document [B, K] | None     given together or not at all.
  causal                       True: key k is visible to query q only if k_pos <= q_pos.
  mask_fn | None               mask_fn(q_streams, k_streams) -> bool [B or 1, q, k] for anything
                               else (a window, a prefix); it reads the positional streams the
                               attention is given (the positions when there are none).
Pair (q, k) of row b is visible iff every condition given holds. Dense and blockwise attention
apply all of them; fused and the Pallas kernels have no streams, so they refuse a mask_fn.

The flash path pads the mask to whole blocks (`pad`: padded queries see nothing, padded keys are
never seen) and cuts one block out of it (`slice_queries`, `slice_keys`) per step of its scans.
"""

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from bipe_jax.attention.blocks import pad_axis
from bipe_jax.attention.blocks import slice_block

MaskFn = Callable[[Any, Any], jax.Array]

KPOS_PAD = jnp.iinfo(jnp.int32).max  # causal index of padded keys (never visible)
QPOS_PAD = jnp.iinfo(jnp.int32).min  # causal index of padded queries (see nothing)
QDOC_PAD, KDOC_PAD = -1, -2  # document ids of padded queries / keys (never equal)


def _static(default):
  return dataclasses.field(default=default, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMask:
  """The mask of one attention call (see the module docstring for the fields)."""
  q_pos: jax.Array
  k_pos: jax.Array
  k_valid: Optional[jax.Array] = None
  q_document: Optional[jax.Array] = None
  k_document: Optional[jax.Array] = None
  causal: bool = _static(True)
  mask_fn: Optional[MaskFn] = _static(None)

  @classmethod
  def causal_from_positions(cls, q_pos_BxQ: jax.Array,
                            k_pos_BxK: Optional[jax.Array] = None) -> 'AttentionMask':
    """The common case: causal, no padding, no documents; `k_pos` defaults to `q_pos`
    (self-attention over the same tokens)."""
    return cls(q_pos=q_pos_BxQ, k_pos=q_pos_BxQ if k_pos_BxK is None else k_pos_BxK)

  def check(self, batch: int, q_len: int, k_len: int) -> None:
    """ValueError (one line naming the field) unless the fields fit B=batch, Q=q_len, K=k_len."""
    if self.q_pos.shape != (batch, q_len) or self.k_pos.shape != (batch, k_len):
      raise ValueError(f'q_pos must be [B, Q]={batch, q_len} and k_pos [B, K]={batch, k_len}; '
                       f'got {self.q_pos.shape} and {self.k_pos.shape}.')
    if (self.q_document is None) != (self.k_document is None):
      raise ValueError('q_document and k_document must be given together.')
    for name, want in (('k_valid', (batch, k_len)), ('q_document', (batch, q_len)),
                       ('k_document', (batch, k_len))):
      x = getattr(self, name)
      if x is not None and x.shape != want:
        raise ValueError(f'{name} must be {want}; got {x.shape}.')

  @property
  def only_causal(self) -> bool:
    """True when nothing but the causal order masks (no padding, documents or mask_fn)."""
    return (self.causal and self.k_valid is None and self.q_document is None and
            self.mask_fn is None)

  def visible(self, q_streams: Any, k_streams: Any) -> jax.Array:
    """bool [B or 1, 1, q, k]: which pairs may attend (`q_streams` / `k_streams` go to
    mask_fn only)."""
    b = self.q_pos.shape[0]
    vis = jnp.ones((b, self.q_pos.shape[1], self.k_pos.shape[1]), bool)
    if self.causal:
      vis = self.k_pos[:, None, :] <= self.q_pos[:, :, None]
    if self.k_valid is not None:
      vis = vis & self.k_valid[:, None, :]
    if self.q_document is not None:
      vis = vis & (self.q_document[:, :, None] == self.k_document[:, None, :])
    if self.mask_fn is not None:
      vis = vis & self.mask_fn(q_streams, k_streams)
    return vis[:, None]

  def keys_in_range(self) -> jax.Array:
    """bool [B, K]: the keys a score transform may read (k_valid, default all True)."""
    return jnp.ones(self.k_pos.shape, bool) if self.k_valid is None else self.k_valid

  def may_see_any(self) -> jax.Array:
    """bool scalar: False when causality alone hides every pair (the smallest key index is
    above the largest query index), so a block can be skipped; True when not causal."""
    if not self.causal:
      return jnp.bool_(True)
    return jnp.min(self.k_pos) <= jnp.max(self.q_pos)

  def map_queries(self, fn: Callable[[jax.Array], jax.Array]) -> 'AttentionMask':
    """The mask with fn applied to its query-side arrays (q_pos, q_document)."""
    return dataclasses.replace(
        self, q_pos=fn(self.q_pos),
        q_document=None if self.q_document is None else fn(self.q_document))

  def map_keys(self, fn: Callable[[jax.Array], jax.Array]) -> 'AttentionMask':
    """The mask with fn applied to its key-side arrays (k_pos, k_valid, k_document)."""
    opt = lambda x: None if x is None else fn(x)
    return dataclasses.replace(self, k_pos=fn(self.k_pos), k_valid=opt(self.k_valid),
                               k_document=opt(self.k_document))

  def pad(self, q_after: int, k_before: int, k_after: int) -> 'AttentionMask':
    """The mask of queries padded by `q_after` and keys by `k_before` / `k_after` (positions
    int32): padded queries see nothing, padded keys are never seen. k_valid is always set
    in the result (False on the padding)."""
    q_pad = lambda x, value: pad_axis(x, 1, 0, q_after, value)
    k_pad = lambda x, value: pad_axis(x, 1, k_before, k_after, value)
    opt = lambda pad, x, value: None if x is None else pad(x, value)
    return dataclasses.replace(
        self, q_pos=q_pad(self.q_pos.astype(jnp.int32), QPOS_PAD),
        k_pos=k_pad(self.k_pos.astype(jnp.int32), KPOS_PAD),
        k_valid=k_pad(self.keys_in_range(), False),
        q_document=opt(q_pad, self.q_document, QDOC_PAD),
        k_document=opt(k_pad, self.k_document, KDOC_PAD))

  def slice_queries(self, start, size: int) -> 'AttentionMask':
    """Queries [start, start + size) (start may be traced)."""
    return self.map_queries(lambda x: slice_block(x, start, size, 1))

  def slice_keys(self, start, size: int) -> 'AttentionMask':
    """Keys [start, start + size) (start may be traced)."""
    return self.map_keys(lambda x: slice_block(x, start, size, 1))

