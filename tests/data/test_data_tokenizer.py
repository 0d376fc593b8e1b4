"""SentencePiece tokenizers: byte-exact round trips, the newline piece, separator tables."""

import pytest

from bipe_jax.data import tokenizer as tokenizer_lib
from tests.data import test_data_builders as corpus


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  folder = tmp_path_factory.mktemp('texts')
  docs = corpus.write_corpus(folder, 40)
  path = str(folder / 'tiny.model')
  return tokenizer_lib.train_tokenizer(docs.values(), path, model_type='bpe', vocab_size=320)


def test_special_ids_and_size(tiny):
  assert tiny.vocab_size == 320
  assert (tiny.unk_id, tiny.bos_id, tiny.eos_id, tiny.pad_id) == (0, 1, 2, -1)
  doc = tiny.encode_document('hi')
  assert doc.dtype.name == 'int32' and doc[0] == 1 and list(doc[1:]) == tiny.encode('hi')


@pytest.mark.parametrize('text', [
    'Alpha beta.\nGamma!\n\n',
    'def f(x):\n    return x  # two  spaces\n',
    '\ttabs\tand trailing spaces   \n\n\n',
    'unseen characters: \u00e9\u00e8 \u4f60\u597d \U0001f600 end',
    '\n',
    '',
])
def test_round_trip_is_byte_exact(tiny, text):
  ids = tiny.encode(text)
  assert tiny.decode(ids) == text
  assert tiny.unk_id not in ids  # byte fallback instead of <unk>


def test_newline_is_its_own_piece_and_a_separator(tiny):
  newline = tiny.encode('\n')
  assert len(newline) == 1 and tiny.id_to_piece(newline[0]) == '\n'
  ids = tiny.encode('alpha\nbeta\n')
  assert ids.count(newline[0]) == 2
  for rule in ('auto', 'newline'):
    assert newline[0] in tiny.separator_ids(rule)
  assert tiny.separator_ids('newline') == tuple(
      i for i in range(tiny.vocab_size) if tiny.id_to_piece(i) in ('\n', '<0x0A>'))


def reference_auto_separators(pieces, specials):
  """Loop-based reading of the rule, independent of the library's helpers: newline pieces, and
  pieces made of exactly one '.', '!' or '?' plus closing quotes / brackets (a leading space
  marker allowed), except the bare '.' piece."""
  out = []
  for i, p in enumerate(pieces):
    if i in specials:
      continue
    if p == '<0x0A>' or '\n' in p:
      out.append(i)
      continue
    if p.startswith('<0x') and p.endswith('>') and len(p) == 6:
      continue  # other byte pieces are not sentence ends
    core = p[1:] if p.startswith('\u2581') else p
    if p == '.' or not core:
      continue
    marks = sum(ch in '.!?' for ch in core)
    if marks == 1 and all(ch in '.!?)]}"\'\u201d\u2019' for ch in core):
      out.append(i)
  return tuple(out)


def test_auto_separators_follow_the_rule(tiny):
  pieces = tiny.pieces()
  sep = tiny.separator_ids('auto')
  assert sep == reference_auto_separators(pieces, {0, 1, 2})
  assert tiny.separator_ids('sentence') == sep
  assert 1 not in sep and 2 not in sep  # BOS / EOS are not separators
  assert tiny.encode('.')[0] not in sep  # the bare '.' is also a decimal point: undecidable


def test_separator_pieces_by_hand():
  for piece in ('\u2581.', '!', '?', '."', ').', '.")', "'.", '\u2581?', '].'):
    assert tokenizer_lib.is_sentence_end_piece(piece), piece
  for piece in ('.', '..', '...', '(?', '\u2581{!', '!=', '\u2581!=', '._', '__.', '.x', '().',
                'end!\u2581', '\u2581', '3.', '.,', '*.'):
    assert not tokenizer_lib.is_sentence_end_piece(piece), piece
  assert tokenizer_lib.is_newline_piece('<0x0A>') and tokenizer_lib.is_newline_piece('\n\n')
  assert not tokenizer_lib.is_newline_piece('<0x0D>')


def test_explicit_and_official_separators(tiny):
  assert tiny.separator_ids([5, 3, 5]) == (3, 5)
  with pytest.raises(ValueError, match=r'\[320\] are outside the vocabulary \[0, 320\)'):
    tiny.separator_ids([3, 320])
  with pytest.raises(ValueError, match="'official' uses ids .*vocab_size 320"):
    tiny.separator_ids('official')
  with pytest.raises(ValueError, match="rule 'sentences' is not one of"):
    tiny.separator_ids('sentences')


def test_vocab_size_check(tiny):
  tokenizer_lib.check_vocab_size(tiny, 320)
  tokenizer_lib.check_vocab_size(tiny, 384, allow_larger_model=True)
  with pytest.raises(ValueError, match=r'model.vocab_size=4096 does not match.*vocab_size 320'):
    tokenizer_lib.check_vocab_size(tiny, 4096)
  with pytest.raises(ValueError, match='model.vocab_size=256'):
    tokenizer_lib.check_vocab_size(tiny, 256, allow_larger_model=True)


def test_training_errors(tmp_path):
  with pytest.raises(ValueError, match="model_type 'word' is not one of"):
    tokenizer_lib.train_tokenizer(['a b'], str(tmp_path / 'x.model'), model_type='word')
  with pytest.raises(ValueError, match='vocab_size=200 is too small'):
    tokenizer_lib.train_tokenizer(['a b'], str(tmp_path / 'x.model'), vocab_size=200)
  with pytest.raises(ValueError, match='empty corpus'):
    tokenizer_lib.train_tokenizer([], str(tmp_path / 'x.model'), vocab_size=300)
  with pytest.raises(ValueError, match='does not exist'):
    tokenizer_lib.Tokenizer(str(tmp_path / 'missing.model'))
  (tmp_path / 'junk.model').write_bytes(b'not a model')
  with pytest.raises(ValueError, match='is not a SentencePiece model'):
    tokenizer_lib.Tokenizer(str(tmp_path / 'junk.model'))


def test_unigram_model_type(tmp_path):
  docs = corpus.write_corpus(tmp_path / 't', 40)
  tok = tokenizer_lib.train_tokenizer(docs.values(), str(tmp_path / 'u.model'),
                                      model_type='unigram', vocab_size=360)
  text = 'Alpha beta gamma.\n  delta\n'
  assert tok.decode(tok.encode(text)) == text and tok.vocab_size == 360


def test_training_chunks_keep_newlines_and_bound_size():
  text = 'a\n' * 3000 + 'x' * 9000 + '\nend\n'
  chunks = list(tokenizer_lib.training_chunks([text], max_bytes=1000))
  assert all(len(c.encode()) <= 1000 for c in chunks)
  assert ''.join(chunks).startswith('a\n' * 3000)
  assert chunks[-1].endswith('end\n')


def test_vocab_too_large_for_the_corpus_is_a_clear_error(tmp_path):
  docs = corpus.write_corpus(tmp_path / 't', 10)
  with pytest.raises(ValueError, match='could not train a unigram tokenizer with vocab_size=5000'):
    tokenizer_lib.train_tokenizer(docs.values(), str(tmp_path / 'u.model'),
                                  model_type='unigram', vocab_size=5000)
