"""Bilevel position streams vs a token-by-token NumPy reference and hand-worked examples."""

import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import positions as P
from tests import reference_numpy as ref

SEP, SEP2, BOS, PAD = 9, 8, 1, 0
VOCAB = 10
STREAMS = ('token', 'intra', 'inter', 'document')


def _compute(tokens, *, jit, **kw):
  table = P.separator_table(VOCAB, [SEP, SEP2])
  fn = lambda t: P.bilevel_positions(t, table, **kw)
  if jit:
    fn = jax.jit(fn)
  return fn(jnp.asarray(tokens, jnp.int32))


def _assert_matches_ref(tokens, out, *, bos, pad, restart):
  expected = ref.bilevel_positions_ref(
      tokens, [SEP, SEP2], document_start_ids=[BOS] if bos else None, pad_id=pad,
      restart_at_documents=restart)
  np.testing.assert_array_equal(np.asarray(out.valid), expected['valid'])
  valid = expected['valid']
  for name in STREAMS:
    got = np.asarray(getattr(out, name))
    chex.assert_shape(got, tokens.shape)
    assert got.dtype == np.int32, name
    np.testing.assert_array_equal(got[valid], expected[name][valid], err_msg=name)
    np.testing.assert_array_equal(got[~valid], 0, err_msg=name)


@pytest.mark.parametrize('jit', [True, False])
def test_worked_example_from_the_paper(jit):
  a, b, c, d, e, f, g = 2, 3, 4, 5, 6, 7, 2
  tokens = np.array([[a, b, c, SEP, d, e, f, SEP, SEP, g, SEP]])
  out = _compute(tokens, jit=jit)
  np.testing.assert_array_equal(out.intra[0], [0, 1, 2, 3, 0, 1, 2, 3, 0, 0, 1])
  np.testing.assert_array_equal(out.inter[0], [0, 0, 0, 0, 1, 1, 1, 1, 2, 3, 3])
  np.testing.assert_array_equal(out.token[0], np.arange(11))
  np.testing.assert_array_equal(out.document[0], 0)
  assert bool(out.valid.all())


def test_intra_resets_after_every_separator():
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, 8, size=(3, 40))
  tokens[rng.random(tokens.shape) < 0.25] = SEP
  out = _compute(tokens, jit=True)
  intra, inter = np.asarray(out.intra), np.asarray(out.inter)
  for b in range(3):
    for t in range(1, 40):
      if tokens[b, t - 1] == SEP:
        assert intra[b, t] == 0 and inter[b, t] == inter[b, t - 1] + 1
      else:
        assert intra[b, t] == intra[b, t - 1] + 1 and inter[b, t] == inter[b, t - 1]


def test_documents_hand_example():
  tokens = np.array([[3, SEP, BOS, 4, SEP, 5, BOS, 6], [BOS, 3, BOS, 4, SEP, 5, 6, 7]])
  kw = dict(document_start_table_V=P.separator_table(VOCAB, [BOS]))
  official = _compute(tokens, jit=False, **kw)
  np.testing.assert_array_equal(official.document, [[0, 0, 1, 1, 1, 1, 2, 2],
                                                    [0, 0, 1, 1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(official.inter[0], [0, 0, 1, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(official.token[0], np.arange(8))
  restarted = _compute(tokens, jit=False, restart_at_documents=True, **kw)
  np.testing.assert_array_equal(restarted.token, [[0, 1, 0, 1, 2, 3, 0, 1],
                                                  [0, 1, 0, 1, 2, 3, 4, 5]])
  np.testing.assert_array_equal(restarted.intra, [[0, 1, 0, 1, 2, 0, 0, 1],
                                                  [0, 1, 0, 1, 2, 0, 1, 2]])
  np.testing.assert_array_equal(restarted.inter, [[0, 0, 0, 0, 0, 1, 0, 0],
                                                  [0, 0, 0, 0, 0, 1, 1, 1]])


def test_padding_is_invisible_to_valid_tokens():
  row = np.array([3, 4, SEP, 5, BOS, 6, SEP, SEP, 7])
  kw = dict(document_start_table_V=P.separator_table(VOCAB, [BOS]), pad_id=PAD)
  plain = _compute(row[None], jit=False, **kw)
  padded_row = np.array([PAD, PAD, 3, 4, PAD, SEP, 5, BOS, PAD, 6, SEP, SEP, 7, PAD])
  padded = _compute(padded_row[None], jit=False, **kw)
  keep = padded_row != PAD
  np.testing.assert_array_equal(np.asarray(padded.valid[0]), keep)
  for name in STREAMS:
    np.testing.assert_array_equal(np.asarray(getattr(padded, name))[0][keep],
                                  np.asarray(getattr(plain, name))[0], err_msg=name)


@st.composite
def _rows(draw):
  batch = draw(st.integers(1, 3))
  length = draw(st.sampled_from([1, 5, 16]))  # few shapes: few jit compilations
  sep_p = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
  bos_p = draw(st.sampled_from([0.0, 0.15]))
  pad_p = draw(st.sampled_from([0.0, 0.3]))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, 8, size=(batch, length))
  u = rng.random(tokens.shape)
  tokens[u < sep_p] = rng.choice([SEP, SEP2], size=tokens.shape)[u < sep_p]
  tokens[rng.random(tokens.shape) < bos_p] = BOS
  if draw(st.booleans()):
    tokens[:, 0] = BOS
  tokens[rng.random(tokens.shape) < pad_p] = PAD
  return tokens


@pytest.mark.parametrize('jit', [True, False])
@hypothesis.settings(max_examples=20, deadline=None, derandomize=True)
@hypothesis.given(tokens=_rows(), use_bos=st.booleans(), use_pad=st.booleans(),
                  restart=st.booleans())
def test_matches_loop_reference(jit, tokens, use_bos, use_pad, restart):
  restart = restart and use_bos
  kw = dict(restart_at_documents=restart, pad_id=PAD if use_pad else None)
  if use_bos:
    kw['document_start_table_V'] = P.separator_table(VOCAB, [BOS])
  out = _compute(tokens, jit=jit, **kw)
  _assert_matches_ref(tokens, out, bos=use_bos, pad=kw['pad_id'], restart=restart)


def test_out_of_vocab_ids_are_refused_eagerly_and_not_separators_under_jit():
  table = P.separator_table(4, [3])
  tokens = jnp.array([[-1, 7, 3, 2, -2]])
  with pytest.raises(ValueError, match=r'ids \[-2, -1, 7\] are out of range for vocab_size 4'):
    P.bilevel_positions(tokens, table)
  out = jax.jit(lambda t: P.bilevel_positions(t, table))(tokens)  # unchecked in a program
  np.testing.assert_array_equal(out.inter[0], [0, 0, 0, 1, 1])


def test_separator_table_and_errors():
  np.testing.assert_array_equal(P.separator_table(5, [1, 3]), [False, True, False, True, False])
  with pytest.raises(ValueError, match=r'\[-1, 5\].*vocab_size=5'):
    P.separator_table(5, [1, 5, -1])
  with pytest.raises(ValueError, match='vocab_size'):
    P.separator_table(0, [])
  with pytest.raises(ValueError, match=r'\[B, T\]'):
    P.bilevel_positions(jnp.zeros((4,), jnp.int32), P.separator_table(5, [1]))
  with pytest.raises(ValueError, match='document_start_table_V'):
    P.bilevel_positions(jnp.zeros((1, 4), jnp.int32), P.separator_table(5, [1]),
                        restart_at_documents=True)


def test_clamp_positions():
  np.testing.assert_array_equal(P.clamp_positions(jnp.array([0, 5, 1023, 1024, 5000]), 1024),
                                [0, 5, 1023, 1023, 1023])
  with pytest.raises(ValueError, match='size'):
    P.clamp_positions(jnp.array([1]), 0)


def test_is_a_pytree_through_jit():
  tokens = jnp.array([[2, SEP, 3, 4], [SEP, SEP, 2, 3]])
  out = jax.jit(lambda t: P.bilevel_positions(t, P.separator_table(VOCAB, [SEP])))(tokens)
  leaves = jax.tree_util.tree_leaves(out)
  assert len(leaves) == 7  # token, intra, inter, document, valid, paragraph, sentence
  np.testing.assert_array_equal(out.inter, [[0, 0, 1, 1], [0, 1, 2, 2]])
