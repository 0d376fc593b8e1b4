"""Fixed-length segments ('fixed:K') and hierarchical BiPE's third stream (bipe_jax/positions.py)
against a token-by-token loop reference, hand examples, chunk carries (the context-parallel
rule), the model's rotary tables, and cached generation against a full forward pass."""

import functools

import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import positions as P
from tests import reference_segments as ref

SEP, PAR, BOS, PAD = 9, 8, 1, 0
VOCAB = 10


def _compute(tokens, *, jit=False, paragraphs=True, fixed=0, **kw):
  table = P.separator_table(VOCAB, [SEP])
  par = P.separator_table(VOCAB, [PAR]) if paragraphs else None
  fn = lambda t: P.bilevel_positions(t, table, paragraph_table_V=par, fixed_segment_length=fixed,
                                     **kw)
  return (jax.jit(fn) if jit else fn)(jnp.asarray(tokens, jnp.int32))


def _assert_matches(out, expected):
  np.testing.assert_array_equal(np.asarray(out.valid), expected['valid'])
  for name in ref.STREAMS:
    got = np.asarray(getattr(out, name))
    chex.assert_shape(got, expected['valid'].shape)
    assert got.dtype == np.int32, name
    np.testing.assert_array_equal(got, np.where(expected['valid'], expected[name], 0),
                                  err_msg=name)


def test_hierarchy_hand_example():
  a, b, c, d = 2, 3, 4, 5
  out = _compute(np.array([[a, SEP, b, PAR, c, SEP, d, PAR, PAR, a]]))
  np.testing.assert_array_equal(out.intra[0], [0, 1, 0, 1, 0, 1, 0, 1, 0, 0])
  np.testing.assert_array_equal(out.inter[0], [0, 0, 1, 1, 2, 2, 3, 3, 4, 5])
  np.testing.assert_array_equal(out.paragraph[0], [0, 0, 0, 0, 1, 1, 1, 1, 2, 3])
  np.testing.assert_array_equal(out.sentence[0], [0, 0, 1, 1, 0, 0, 1, 1, 0, 0])


def test_without_paragraph_table_the_row_is_one_paragraph():
  tokens = np.array([[2, SEP, 3, PAR, 4, SEP, 5]])
  out = _compute(tokens, paragraphs=False)
  np.testing.assert_array_equal(out.paragraph, 0)
  np.testing.assert_array_equal(out.sentence, out.inter)
  np.testing.assert_array_equal(out.inter[0], [0, 0, 1, 1, 1, 1, 2])  # PAR is a plain token


@pytest.mark.parametrize('jit', [True, False])
def test_fixed_hand_example(jit):
  # Separators are ignored; padding takes no position; BOS restarts with restart_at_documents.
  tokens = np.array([[2, SEP, 3, 4, 5, 6, 7], [2, PAD, 3, 4, BOS, 5, 6]])
  out = _compute(tokens, jit=jit, paragraphs=False, fixed=3, pad_id=PAD,
                 document_start_table_V=P.separator_table(VOCAB, [BOS]),
                 restart_at_documents=True)
  np.testing.assert_array_equal(out.intra, [[0, 1, 2, 0, 1, 2, 0], [0, 0, 1, 2, 0, 1, 2]])
  np.testing.assert_array_equal(out.inter, [[0, 0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 0, 0, 0]])


def test_fixed_and_paragraphs_are_refused():
  with pytest.raises(ValueError, match='cannot be combined'):
    _compute(np.array([[2, 3]]), fixed=2)
  with pytest.raises(ValueError, match='fixed_segment_length must be >= 0'):
    _compute(np.array([[2, 3]]), paragraphs=False, fixed=-1)


@st.composite
def _rows(draw):
  batch = draw(st.integers(1, 3))
  length = draw(st.sampled_from([1, 6, 17]))  # few shapes: few jit compilations
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, 8, size=(batch, length))
  for token, p in ((SEP, draw(st.sampled_from([0.0, 0.2, 0.6]))),
                   (PAR, draw(st.sampled_from([0.0, 0.15, 0.5]))),
                   (BOS, draw(st.sampled_from([0.0, 0.15]))),
                   (PAD, draw(st.sampled_from([0.0, 0.3])))):
    tokens[rng.random(tokens.shape) < p] = token
  return tokens


@pytest.mark.parametrize('jit', [True, False])
@hypothesis.settings(max_examples=15, deadline=None, derandomize=True)
@hypothesis.given(tokens=_rows(), fixed=st.sampled_from([0, 0, 1, 3, 5]), use_bos=st.booleans(),
                  use_pad=st.booleans(), restart=st.booleans())
def test_matches_loop_reference(jit, tokens, fixed, use_bos, use_pad, restart):
  restart = restart and use_bos
  kw = dict(restart_at_documents=restart, pad_id=PAD if use_pad else None)
  if use_bos:
    kw['document_start_table_V'] = P.separator_table(VOCAB, [BOS])
  out = _compute(tokens, jit=jit, paragraphs=not fixed, fixed=fixed, **kw)
  expected = ref.segment_streams_ref(
      tokens, [SEP], paragraph_ids=() if fixed else [PAR], fixed=fixed,
      document_start_ids=[BOS] if use_bos else (), pad_id=kw['pad_id'],
      restart_at_documents=restart)
  _assert_matches(out, expected)


def _boundary_rows():
  """[3, 32] ids: paragraph / sentence separators and document starts on chunk edges."""
  rng = np.random.default_rng(3)
  tokens = rng.integers(2, 8, size=(3, 32))
  tokens[0, [7, 8, 15, 23]] = PAR
  tokens[0, [3, 16, 24]] = SEP
  tokens[0, [0, 12]] = BOS
  tokens[1, :9] = PAD
  tokens[1, [10, 16]] = BOS
  tokens[1, [15, 31]] = PAR
  tokens[2, ::5] = SEP
  tokens[2, [4, 20]] = PAR
  tokens[2, 16] = BOS
  return tokens


@pytest.mark.parametrize('fixed', [0, 3, 8])
@pytest.mark.parametrize('restart', [False, True])
def test_chunks_with_carries_give_the_streams_of_the_whole_row(fixed, restart):
  """The rule the context-parallel shards use (bipe_jax/attention/context_parallel.py): each chunk from
  the combined summaries of the chunks before it equals its slice of the whole row."""
  tokens = _boundary_rows()
  table = P.separator_table(VOCAB, [SEP])
  kw = dict(document_start_table_V=P.separator_table(VOCAB, [BOS]), pad_id=PAD,
            paragraph_table_V=None if fixed else P.separator_table(VOCAB, [PAR]))
  stack = lambda p: np.stack([np.asarray(getattr(p, n)) for n in ref.STREAMS])
  whole = P.bilevel_positions(tokens, table, restart_at_documents=restart,
                              fixed_segment_length=fixed, **kw)
  _assert_matches(whole, ref.segment_streams_ref(
      tokens, [SEP], paragraph_ids=() if fixed else [PAR], fixed=fixed, document_start_ids=[BOS],
      pad_id=PAD, restart_at_documents=restart))
  carry, got = P.PositionCarry.empty(3), []
  for lo, hi in zip([0, 5, 8, 9, 16, 23], [5, 8, 9, 16, 23, 32]):
    chunk = tokens[:, lo:hi]
    got.append(stack(P.bilevel_positions(chunk, table, restart_at_documents=restart,
                                         carry=carry, fixed_segment_length=fixed, **kw)))
    carry = P.combine_carries(carry, P.chunk_carry(chunk, table, **kw))
  np.testing.assert_array_equal(np.concatenate(got, axis=2), stack(whole))


def test_mixed_rotary_tables_match_numpy():
  from bipe_jax.encodings import hierarchical, rope  # pylint: disable=g-import-not-at-top
  dh = 8
  inv = np.asarray(rope.rope_inv_frequencies(dh, 10000.0, 'none', 1.0, 0))
  sentence = np.array([[0, 1, 1, 2]])
  paragraph = np.array([[0, 0, 3, 3]])
  cos, sin = hierarchical.mix_rotary_tables(rope.rope_cos_sin(jnp.asarray(sentence), inv),
                                            rope.rope_cos_sin(jnp.asarray(paragraph), inv))
  chex.assert_shape(cos, (1, 1, 4, dh))
  for t in range(4):
    for d in range(dh):
      j = d % (dh // 2)
      pos = paragraph[0, t] if j % 2 else sentence[0, t]
      np.testing.assert_allclose(cos[0, 0, t, d], np.cos(pos * inv[j]), rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(sin[0, 0, t, d], np.sin(pos * inv[j]), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the model and its KV cache

SEPS, PARS = (2,), (3,)
PROMPT = np.array([[4, 5, 2, 6, 3, 7, 3], [1, 5, 3, 3, 4, 2, 6]], np.int32)


@functools.lru_cache(maxsize=None)
def _tiny_model(name, separators='ids', paragraph_ids=PARS):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from bipe_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  fields = dict(vocab_size=8, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                ffn_size=32, position_encoding=name, separators=separators,
                separator_ids=SEPS if separators == 'ids' else (), paragraph_ids=paragraph_ids,
                max_intra=16, max_position=32, train_length=16, attention_impl='dense', bos_id=1)
  model = model_lib.Transformer(config_lib.model_config_from_dict(fields))
  shapes = nn.meta.unbox(jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32)))['params'])
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: (0.3 * rng.standard_normal(s.shape)).astype(s.dtype), shapes)
  return model, params


def test_config_parses_fixed_rule_and_refuses_bad_ones():
  from bipe_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  cfg = config_lib.ModelConfig(position_encoding='bipe_rope', separators='fixed:12')
  assert cfg.fixed_segment_length == 12
  assert config_lib.ModelConfig(separators='sentence', separator_ids=(3,)).fixed_segment_length == 0
  for bad in ('fixed:0', 'fixed:x', 'fixed:'):
    with pytest.raises(ValueError, match=f"model.separators='{bad}'"):
      config_lib.ModelConfig(position_encoding='bipe_rope', separators=bad)
  with pytest.raises(ValueError, match='needs text separators'):
    config_lib.ModelConfig(position_encoding='bipe3_rope', separators='fixed:4')


def test_hierarchical_model_uses_the_paragraph_streams():
  """The same weights without paragraph ids (one paragraph) give other logits: the third
  stream reaches the attention."""
  model, params = _tiny_model('bipe3_rope')
  flat, _ = _tiny_model('bipe3_rope', paragraph_ids=())
  with_par = np.asarray(model.apply({'params': params}, PROMPT))
  without = np.asarray(flat.apply({'params': params}, PROMPT))
  # Identical up to the first paragraph separator (position 4 / 2 + 1), different after.
  np.testing.assert_allclose(with_par[0, :5], without[0, :5], rtol=1e-5, atol=1e-5)
  assert np.abs(with_par[0, 5:] - without[0, 5:]).max() > 1e-3


@pytest.mark.parametrize('name,separators', [('bipe3_rope', 'ids'), ('bipe_rope', 'fixed:3')])
def test_cached_generation_equals_full_forward(name, separators):
  from bipe_jax import generation  # pylint: disable=g-import-not-at-top
  model, params = _tiny_model(name, separators)
  new = 9
  out, logits = generation.generate(
      model, params, PROMPT, max_new_tokens=new, return_logits=True,
      sampling=generation.SamplingConfig(temperature=4.0), rng=jax.random.PRNGKey(3))
  full = np.asarray(jax.jit(model.apply)({'params': params}, out))
  chex.assert_shape(logits, (2, new, 8))
  np.testing.assert_allclose(np.asarray(logits), full[:, PROMPT.shape[1] - 1:-1], atol=1e-4,
                             rtol=1e-4)
  fed_back = np.asarray(out[:, PROMPT.shape[1]:-1])
  if separators == 'ids':  # new paragraphs and sentences start while decoding
    assert np.isin(fed_back, PARS).any() and np.isin(fed_back, SEPS).any()
