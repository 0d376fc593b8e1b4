"""Randomized positions (Ruoss et al. 2023, "Randomized positional encodings boost length
generalization of transformers"; `model.randomized_positions=L`, docs/design.md).

A row whose position stream takes the values 0..m-1 gets instead an ordered random subset of
0..L-1 of m elements: value k becomes the k-th smallest of m distinct integers drawn uniformly
without replacement from 0..L-1 (the benchmark's `jrandom.choice(arange(L), (m,),
replace=False)` followed by a sort). Every row of a batch has its own draw (the benchmark draws
one per batch), and every stream a scheme reads has its own (BiPE's inter-segment index: one per
segment; the token stream: one per token). A draw is a function of the key, the row's index and
its number of values only: the same key gives the same positions (`ordered_draw`).

Padding takes no position (positions.py): m counts the row's valid values only, and padding
stays at 0. With documents that restart the streams (`restart_at_documents`), the row draws one
subset for all its documents and each document's positions are its slice of that subset, shifted
so that the document starts at 0 (ordered, inside 0..L-1, restarting like the ordinary streams).
"""

from typing import Optional, Sequence

import jax
import jax.numpy as jnp

from bipe_jax import positions as positions_lib

STREAMS = ('token', 'inter', 'paragraph')  # the streams that grow with the row (intra does not)


def ordered_draw(key: jax.Array, counts_B: jax.Array, length: int, max_length: int) -> jax.Array:
  """int32 [B, length]: row b's first counts[b] entries are an increasing random subset of
  0..max_length-1 (uniform over the subsets of that size); the entries after them are
  `max_length` (no position). A count above min(length, max_length) is cut to it.

  Row b's key is fold_in(key, b): its draw is the first counts[b] entries of a uniform random
  permutation of 0..max_length-1, sorted. It depends on the key, b and the count only, not on
  `length` nor on the batch size (a prefix of the same permutation): padding a row further, or
  batching it with more rows after it, changes nothing.
  """
  if max_length <= 0:
    raise ValueError(f'randomized positions: L={max_length} must be positive.')
  b = counts_B.shape[0]
  k = min(length, max_length)
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(b))
  perm_BxK = jax.vmap(lambda r: jax.random.permutation(r, max_length)[:k])(keys)
  keep = jnp.arange(k)[None, :] < counts_B[:, None]
  draw = jnp.sort(jnp.where(keep, perm_BxK, max_length), axis=1).astype(jnp.int32)
  return jnp.pad(draw, ((0, 0), (0, length - k)), constant_values=max_length)


def check_row_length(length: int, max_length: int) -> None:
  """ValueError unless a row of `length` tokens can take distinct positions of 0..L-1."""
  if length > max_length:
    raise ValueError(f'randomized positions: a row of {length} tokens cannot take distinct '
                     f'positions in 0..{max_length - 1} (model.randomized_positions='
                     f'{max_length} must be >= the row length).')


def _previous_valid(x_BxT: jax.Array, valid_BxT: jax.Array) -> jax.Array:
  """x at the last valid token strictly before t ([B, T]; x itself where there is none)."""
  t = x_BxT.shape[1]
  idx = jnp.where(valid_BxT, jnp.arange(t)[None, :], -1)
  last = jax.lax.cummax(idx, axis=1)
  before = jnp.concatenate([jnp.full_like(last[:, :1], -1), last[:, :-1]], axis=1)
  prev = jnp.take_along_axis(x_BxT, jnp.maximum(before, 0), axis=1)
  return jnp.where(before >= 0, prev, x_BxT)


def _row_index(stream_BxT: jax.Array, document_BxT: Optional[jax.Array],
               valid_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(g, starts) [B, T]: g numbers the row's values of a stream 0, 1, 2, ... across the whole
  row (a stream that restarts at documents is continued: each document start is one step);
  starts is True at the first valid token of each document (None: no restarts, g = stream)."""
  if document_BxT is None:
    return stream_BxT, None
  new_doc = valid_BxT & (document_BxT != _previous_valid(document_BxT, valid_BxT))
  first = valid_BxT & (jnp.cumsum(valid_BxT, axis=1) == 1)
  step = jnp.where(new_doc, 1, stream_BxT - _previous_valid(stream_BxT, valid_BxT))
  g = jnp.cumsum(jnp.where(valid_BxT & ~first, step, 0), axis=1)
  return g.astype(jnp.int32), new_doc | first


def randomize_stream(key: jax.Array, stream_BxT: jax.Array, valid_BxT: jax.Array,
                     max_length: int, document_BxT: Optional[jax.Array] = None) -> jax.Array:
  """int32 [B, T]: the stream with each row's values 0..m-1 mapped to an ordered random subset
  of 0..max_length-1 (`ordered_draw`); 0 at padding. `document_BxT` given: the stream restarts
  at documents, and so do the randomized positions (each document starts at 0)."""
  valid = jnp.asarray(valid_BxT, bool)
  g, starts = _row_index(stream_BxT.astype(jnp.int32), document_BxT, valid)
  counts = jnp.max(jnp.where(valid, g + 1, 0), axis=1)
  draw = ordered_draw(key, counts, stream_BxT.shape[1], max_length)
  out = jnp.take_along_axis(draw, jnp.clip(g, 0, stream_BxT.shape[1] - 1), axis=1)
  if starts is not None:  # the draw increases along the row: the last start's value
    out = out - jax.lax.cummax(jnp.where(starts, out, 0), axis=1)
  return jnp.where(valid, out, 0).astype(jnp.int32)


def randomize_positions(pos: positions_lib.BilevelPositions, key: jax.Array, max_length: int,
                        streams: Sequence[str] = STREAMS,
                        restart_at_documents: bool = False) -> positions_lib.BilevelPositions:
  """`pos` with each of `streams` (of 'token', 'inter', 'paragraph') randomized
  (`randomize_stream`; stream i of STREAMS draws from jax.random.split(key, 3)[i]); the others (intra, sentence,
  document, valid) are kept. A stream given as None (paragraph without a hierarchy) stays None.
  """
  bad = sorted(set(streams) - set(STREAMS))
  if bad:
    raise ValueError(f'randomize_positions: streams {bad} are not among {STREAMS}.')
  # A row of T tokens may have T values of any stream (T segments: every token a separator).
  check_row_length(pos.token.shape[1], max_length)
  documents = pos.document if restart_at_documents else None
  changes = {}
  keys = jax.random.split(key, len(STREAMS))  # split: fold_in(key, i) is left to the caller
  for i, name in enumerate(STREAMS):
    value = getattr(pos, name)
    if name in streams and value is not None:
      changes[name] = randomize_stream(keys[i], value, pos.valid, max_length, documents)
  return pos.replace(**changes)


def scheme_streams(scheme) -> tuple:
  """The randomizable streams a `schemes.Scheme` reads (() for one with no token positions)."""
  read = set()
  if scheme.input != 'none':
    read.add(scheme.input_stream)
  if scheme.rotary == 'hierarchical':
    read.add('paragraph')
  elif scheme.rotary != 'none':
    read.add(scheme.rotary)
  if scheme.bias != 'none' and not scheme.uses_forget_gate:
    read.add(scheme.bias_stream)
  return tuple(s for s in STREAMS if s in read)


def refusal(scheme) -> Optional[str]:
  """Why `scheme` cannot take randomized positions (None: it can)."""
  if scheme.uses_forget_gate or scheme.transform == 'cope':
    return (f'{scheme.name} has no token positions to randomize (its positions come from '
            'gates over the content)')
  return None
