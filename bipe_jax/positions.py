"""Bilevel position streams (BiPE: He et al. 2024, arXiv:2401.16421), computed inside jit.

Every token gets:
  token:    its absolute position 0..T-1,
  intra:    its offset from the start of its segment (0-based),
  inter:    the index of its segment = number of separators strictly before it,
  document: the index of the packed document it belongs to,
  valid:    False on padding.

A separator belongs to the segment it ends; the next token starts a new segment. Example with
S a separator: `[a b c S d e f S S g S]` -> intra `[0 1 2 3 0 1 2 3 0 0 1]`,
inter `[0 0 0 0 1 1 1 1 2 3 3]`.

Everything is a cumulative sum / cumulative max over the T axis (no Python loop over positions,
no host round trip), so it runs per row inside a jitted train step.

Padding (`tokens == pad_id`, or False in `valid_BxT`) is invisible: it never ends a segment,
and it is not counted in any position, so the positions of the valid tokens are exactly those of
the same row with the padding removed (left, right or interior padding alike). Without padding, `token` is 0..T-1 (the official
behaviour). All streams are 0 at padding positions.

Documents: with a `document_start_table_V` (BOS ids), `document` counts the document starts at or
before t; a start at the row's first valid token opens document 0, and a row that does not start
with BOS has its leading partial document as document 0 (so `[a b BOS c]` -> `[0 0 1 1]`,
`[BOS a BOS b]` -> `[0 0 1 1]`). With `restart_at_documents=True` the token, intra and inter
streams restart at every document start (BOS opens a new segment at intra 0, inter 0); the
default (False) is the official BiPE behaviour, where BOS is an ordinary token.

Fixed-length segments (`fixed_segment_length=K`, the separator rule `fixed:K`; BiPE's ablation):
a boundary after every K-th token whatever the text, so intra = token % K and inter = token // K
(the token stream, hence padding-free and restarting at documents like it). The separator table
is then ignored.

Hierarchy (`paragraph_table_V`, the third stream of hierarchical BiPE, docs/design.md): a
paragraph separator (e.g. a newline piece) ends its paragraph and also its segment. Two more
streams:
  paragraph: the number of paragraph separators strictly before t (restarting at documents
             when documents restart);
  sentence:  the index of t's segment inside its paragraph (inter minus the segments of the
             paragraphs before).
Example with `.` a separator and `|` a paragraph separator: `[a . b | c . d]` -> intra
`[0 1 0 1 0 1 0]`, inter `[0 0 1 1 2 2 3]`, paragraph `[0 0 0 0 1 1 1]`, sentence
`[0 0 1 1 0 0 1]`. Without a paragraph table the row is one paragraph: paragraph 0 and
sentence = inter.
"""

from typing import Iterable, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax import input_checks


@flax.struct.dataclass
class BilevelPositions:
  """The position streams of a batch; every field is [B, T]."""
  token: jax.Array  # int32, 0..T-1 (restarts per document when documents restart)
  intra: jax.Array  # int32, offset inside the segment (not clamped)
  inter: jax.Array  # int32, segment index
  document: jax.Array  # int32, packed-document index (0 when documents are not tracked)
  valid: jax.Array  # bool, False on padding
  paragraph: Optional[jax.Array] = None  # int32, paragraph index (hierarchy; None: not given)
  sentence: Optional[jax.Array] = None  # int32, segment index inside the paragraph


def separator_table(vocab_size: int, separator_ids: Iterable[int]) -> np.ndarray:
  """A [V] bool lookup table, True at every id in `separator_ids`.

  Raises ValueError naming any id outside [0, vocab_size) and a non-positive vocab_size.
  """
  vocab_size = int(vocab_size)
  if vocab_size <= 0:
    raise ValueError(f'vocab_size must be positive, got {vocab_size}.')
  ids = [int(i) for i in separator_ids]
  bad = sorted({i for i in ids if not 0 <= i < vocab_size})
  if bad:
    raise ValueError(
        f'separator_ids {bad} are out of range for vocab_size={vocab_size}; '
        f'allowed ids are 0..{vocab_size - 1}.')
  table_V = np.zeros((vocab_size,), dtype=bool)
  table_V[ids] = True
  return table_V


def clamp_positions(positions: jax.Array, size: int) -> jax.Array:
  """Clamps positions into [0, size-1], as the official code does for its learned tables."""
  if size <= 0:
    raise ValueError(f'table size must be positive, got {size}.')
  return jnp.clip(positions, 0, size - 1)


def _lookup(table_V, tokens_BxT: jax.Array) -> jax.Array:
  """table_V[tokens] as bool [B, T]; ids outside [0, V) give False (no wrap-around)."""
  table_V = jnp.asarray(table_V, dtype=bool)
  if table_V.ndim != 1:
    raise ValueError(f'a token table must be 1-D [V], got shape {table_V.shape}.')
  vocab = table_V.shape[0]
  in_range = (tokens_BxT >= 0) & (tokens_BxT < vocab)
  safe = jnp.where(in_range, tokens_BxT, 0)
  return table_V[safe] & in_range


def _exclusive_shift(x_BxT: jax.Array, fill) -> jax.Array:
  """x shifted right by one along T: out[:, t] = x[:, t-1], out[:, 0] = fill."""
  first = jnp.full_like(x_BxT[:, :1], fill)
  return jnp.concatenate([first, x_BxT[:, :-1]], axis=1)


@flax.struct.dataclass
class PositionCarry:
  """What the streams of a chunk of a row need from the tokens before it; every field is [B].

  `bilevel_positions(chunk, carry=c)` equals the chunk's slice of the streams of the whole row
  when `c` summarises everything before the chunk. A chunk's own summary (`chunk_carry`) is
  the carry after it from `PositionCarry.empty`; summaries of consecutive chunks combine with
  `combine_carries` (associative), so the carry of a context-parallel shard is an exclusive
  scan over the shards' summaries (bipe_jax/attention/context_parallel.py).
  """
  valid: jax.Array  # int32, valid tokens before
  seps: jax.Array  # int32, separators before
  last_sep: jax.Array  # int32, valid-token count of the last separator before (-1: none)
  docs: jax.Array  # int32, document starts before
  doc_count: jax.Array  # int32, valid-token count of the last document start (0: none)
  doc_seps: jax.Array  # int32, separators before the last document start (0: none)
  first_is_doc: jax.Array  # int32, 1 if the row's first valid token starts a document, 0 if
  #                           not, -1 while no valid token has been seen
  pars: jax.Array  # int32, paragraph separators before
  par_mark: jax.Array  # int32, separators up to and including the last paragraph separator
  doc_pars: jax.Array  # int32, paragraph separators before the last document start

  @classmethod
  def empty(cls, batch: int) -> 'PositionCarry':
    """The carry at the start of a row."""
    z = jnp.zeros((batch,), jnp.int32)
    return cls(valid=z, seps=z, last_sep=z - 1, docs=z, doc_count=z, doc_seps=z,
               first_is_doc=z - 1, pars=z, par_mark=z, doc_pars=z)


def combine_carries(a: PositionCarry, b: PositionCarry) -> PositionCarry:
  """The summary of chunk A followed by chunk B, from their summaries (any leading shape)."""
  b_has_doc = b.docs > 0
  return PositionCarry(
      valid=a.valid + b.valid,
      seps=a.seps + b.seps,
      last_sep=jnp.where(b.last_sep >= 0, a.valid + b.last_sep, a.last_sep),
      docs=a.docs + b.docs,
      doc_count=jnp.where(b_has_doc, a.valid + b.doc_count, a.doc_count),
      doc_seps=jnp.where(b_has_doc, a.seps + b.doc_seps, a.doc_seps),
      first_is_doc=jnp.where(a.first_is_doc >= 0, a.first_is_doc, b.first_is_doc),
      pars=a.pars + b.pars,
      par_mark=jnp.where(b.pars > 0, a.seps + b.par_mark, a.par_mark),
      doc_pars=jnp.where(b_has_doc, a.pars + b.doc_pars, a.doc_pars))


def _token_flags(tokens_BxT, separator_table_V, document_start_table_V, pad_id, valid_BxT,
                 paragraph_table_V=None):
  """(valid, is_sep, is_doc or None, is_par or None), bool [B, T], after the input checks.

  A paragraph separator is also a separator."""
  tokens_BxT = jnp.asarray(tokens_BxT)
  if tokens_BxT.ndim != 2:
    raise ValueError(f'tokens must be [B, T], got shape {tokens_BxT.shape}.')
  if not jnp.issubdtype(tokens_BxT.dtype, jnp.integer):
    raise ValueError(f'tokens must be integer ids, got dtype {tokens_BxT.dtype}.')
  if pad_id is None:
    valid = jnp.ones(tokens_BxT.shape, dtype=bool)
  else:
    valid = tokens_BxT != pad_id
  if valid_BxT is not None:
    valid = valid & jnp.asarray(valid_BxT, bool)
  is_sep = _lookup(separator_table_V, tokens_BxT) & valid
  is_doc = None
  if document_start_table_V is not None:
    is_doc = _lookup(document_start_table_V, tokens_BxT) & valid
  is_par = None
  if paragraph_table_V is not None:
    is_par = _lookup(paragraph_table_V, tokens_BxT) & valid
    is_sep = is_sep | is_par
  return valid, is_sep, is_doc, is_par


def chunk_carry(tokens_BxT: jax.Array,
                separator_table_V,
                *,
                document_start_table_V=None,
                pad_id: Optional[int] = None,
                valid_BxT: Optional[jax.Array] = None,
                paragraph_table_V=None) -> PositionCarry:
  """The summary of a chunk of rows [B, T]: the carry after it, starting from an empty one."""
  valid, is_sep, is_doc, is_par = _token_flags(tokens_BxT, separator_table_V,
                                               document_start_table_V, pad_id, valid_BxT,
                                               paragraph_table_V)
  i32 = jnp.int32
  count = jnp.cumsum(valid.astype(i32), axis=1, dtype=i32) - 1
  seps_before = _exclusive_shift(jnp.cumsum(is_sep.astype(i32), axis=1, dtype=i32), 0)
  last = lambda flags, x, none: jnp.max(jnp.where(flags, x, none), axis=1).astype(i32)
  zeros = jnp.zeros(valid.shape[:1], i32)
  if is_doc is None:
    docs = doc_count = doc_seps = first_is_doc = zeros
  else:
    docs = jnp.sum(is_doc, axis=1, dtype=i32)
    doc_count = last(is_doc, count, 0)
    doc_seps = last(is_doc, seps_before, 0)
    first_is_doc = _first_valid_flag(valid, is_doc)
  pars = par_mark = doc_pars = zeros
  if is_par is not None:
    pars = jnp.sum(is_par, axis=1, dtype=i32)
    par_mark = last(is_par, seps_before + is_sep.astype(i32), 0)
    if is_doc is not None:
      doc_pars = last(is_doc, _exclusive_shift(jnp.cumsum(is_par.astype(i32), axis=1,
                                                          dtype=i32), 0), 0)
  return PositionCarry(
      valid=jnp.sum(valid, axis=1, dtype=i32), seps=jnp.sum(is_sep, axis=1, dtype=i32),
      last_sep=last(is_sep, count, -1), docs=docs, doc_count=doc_count, doc_seps=doc_seps,
      first_is_doc=jnp.where(jnp.any(valid, axis=1), first_is_doc, -1), pars=pars,
      par_mark=par_mark, doc_pars=doc_pars)


def _first_valid_flag(valid_BxT, flags_BxT) -> jax.Array:
  """int32 [B]: flags at the first valid token of each row (flags[0] when none is valid)."""
  first_valid = jnp.argmax(valid_BxT, axis=1)[:, None]
  return jnp.take_along_axis(flags_BxT, first_valid, axis=1)[:, 0].astype(jnp.int32)


def bilevel_positions(tokens_BxT: jax.Array,
                      separator_table_V,
                      *,
                      document_start_table_V=None,
                      pad_id: Optional[int] = None,
                      restart_at_documents: bool = False,
                      valid_BxT: Optional[jax.Array] = None,
                      carry: Optional[PositionCarry] = None,
                      paragraph_table_V=None,
                      fixed_segment_length: int = 0) -> BilevelPositions:
  """Computes the bilevel position streams of a batch of token ids.

  Args:
    tokens_BxT: int token ids [B, T].
    separator_table_V: [V] bool, True at separator ids (see `separator_table`).
    document_start_table_V: optional [V] bool, True at document-start ids (BOS). None: every
      token is in document 0 and documents never restart.
    pad_id: id of the padding token, or None when there is no padding.
    restart_at_documents: restart token / intra / inter at every document start (needs
      `document_start_table_V`). False = official BiPE.
    valid_BxT: optional bool [B, T], False at padding (e.g. the left padding of a batch of
      prompts of different lengths); combined with `pad_id`.
    carry: optional `PositionCarry` of the tokens before these (the rows are then a chunk of
      longer rows, e.g. one context-parallel shard); None = the rows start here.
    paragraph_table_V: optional [V] bool, True at paragraph-separator ids (the hierarchy's
      third level; they also end segments). None: one paragraph (paragraph 0, sentence = inter).
    fixed_segment_length: K > 0 cuts a segment every K tokens of the token stream (the
      separator rule `fixed:K`; the separator table is ignored); 0 = separators.

  Returns:
    BilevelPositions with [B, T] int32 streams and the bool valid mask.
  """
  if restart_at_documents and document_start_table_V is None:
    raise ValueError('restart_at_documents=True needs document_start_table_V (the BOS ids).')
  if fixed_segment_length < 0:
    raise ValueError(f'fixed_segment_length must be >= 0, got {fixed_segment_length}.')
  if fixed_segment_length and paragraph_table_V is not None:
    raise ValueError('fixed-length segments (fixed_segment_length) and a paragraph table '
                     'cannot be combined: paragraphs need text separators.')
  # An id beyond the table would silently be no separator: refused when the ids are concrete
  # (under jit it is not checked, and is no separator).
  input_checks.check_token_ids(tokens_BxT, np.shape(separator_table_V)[0],
                               'bilevel_positions tokens (beyond separator_table_V [V])',
                               valid_BxT)
  valid, is_sep, is_doc, is_par = _token_flags(tokens_BxT, separator_table_V,
                                               document_start_table_V, pad_id, valid_BxT,
                                               paragraph_table_V)
  i32 = jnp.int32
  if carry is None:
    carry = PositionCarry.empty(valid.shape[0])
  before = lambda x: x[:, None]  # a [B] carry field against [B, T]

  # Index of each token among the valid tokens of its row (pads do not count).
  count = before(carry.valid) + jnp.cumsum(valid.astype(i32), axis=1, dtype=i32) - 1
  # Number of separators strictly before t, and the count of the last separator before t.
  seps_before = before(carry.seps) + _exclusive_shift(
      jnp.cumsum(is_sep.astype(i32), axis=1, dtype=i32), 0)
  last_sep = jnp.maximum(before(carry.last_sep), _exclusive_shift(
      jax.lax.cummax(jnp.where(is_sep, count, -1), axis=1), -1))

  if is_doc is None:
    document = jnp.zeros_like(count)
    token, inter = count, seps_before
    segment_open = last_sep  # count of the token just before the segment start
  else:
    starts_upto = before(carry.docs) + jnp.cumsum(is_doc.astype(i32), axis=1, dtype=i32)
    # A document start at the row's first valid token opens document 0, not 1.
    first_is_doc = jnp.where(carry.first_is_doc >= 0, carry.first_is_doc,
                             _first_valid_flag(valid, is_doc))
    document = starts_upto - before(first_is_doc)
    if restart_at_documents:
      doc_count = jnp.maximum(before(carry.doc_count),
                              jax.lax.cummax(jnp.where(is_doc, count, 0), axis=1))
      doc_seps = jnp.maximum(before(carry.doc_seps),
                             jax.lax.cummax(jnp.where(is_doc, seps_before, 0), axis=1))
      token = count - doc_count
      inter = seps_before - doc_seps
      segment_open = jnp.maximum(last_sep, doc_count - 1)
    else:
      token, inter = count, seps_before
      segment_open = last_sep
  intra = count - segment_open - 1
  if fixed_segment_length:
    intra, inter = token % fixed_segment_length, token // fixed_segment_length

  paragraph, sentence = jnp.zeros_like(count), inter
  if is_par is not None:
    pars_before = before(carry.pars) + _exclusive_shift(
        jnp.cumsum(is_par.astype(i32), axis=1, dtype=i32), 0)
    # Separators up to the last paragraph separator before t: the segments of earlier paragraphs.
    par_mark = jnp.maximum(before(carry.par_mark), _exclusive_shift(
        jax.lax.cummax(jnp.where(is_par, seps_before + is_sep.astype(i32), 0), axis=1), 0))
    paragraph, sentence = pars_before, seps_before - par_mark
    if is_doc is not None and restart_at_documents:
      doc_pars = jnp.maximum(before(carry.doc_pars),
                             jax.lax.cummax(jnp.where(is_doc, pars_before, 0), axis=1))
      paragraph = pars_before - doc_pars
      sentence = seps_before - jnp.maximum(par_mark, doc_seps)

  zero = lambda x: jnp.where(valid, x, 0).astype(i32)
  return BilevelPositions(
      token=zero(token), intra=zero(intra), inter=zero(inter), document=zero(document),
      valid=valid, paragraph=zero(paragraph), sentence=zero(sentence))
