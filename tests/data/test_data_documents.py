"""Documents: counted UTF-8 repair, the deterministic split, and the text-folder reader."""

import json
import random

import pytest

from bipe_jax.data import documents
from bipe_jax.data import text_folder


def test_decode_bytes_counts_each_bad_sequence():
  text, n = documents.decode_bytes(b'ab\xffc\xc3\xa9d\xe4\xbd')
  assert text == 'ab\ufffdc\u00e9d\ufffd'
  assert n == 2
  # A genuine U+FFFD in valid UTF-8 is not a repair.
  assert documents.decode_bytes('x\ufffd'.encode()) == ('x\ufffd', 0)


def test_choose_validation_is_order_independent_and_sized():
  ids = [f'doc{i}.txt' for i in range(200)]
  val = documents.choose_validation(ids, 0.1)
  shuffled = ids[:]
  random.Random(3).shuffle(shuffled)
  assert documents.choose_validation(shuffled, 0.1) == val
  assert len(val) == 20 and val <= set(ids)
  assert len(documents.choose_validation(ids[:2], 0.01)) == 1  # at least one
  assert len(documents.choose_validation(ids[:3], 0.99)) == 2  # at least one train document


@pytest.mark.parametrize('ids,frac,match', [
    (['a'], 0.5, 'at least 2 documents'),
    (['a', 'b'], 0.0, 'validation_fraction'),
    (['a', 'b'], 1.0, 'validation_fraction'),
    (['a', 'a'], 0.5, 'unique'),
])
def test_choose_validation_errors(ids, frac, match):
  with pytest.raises(ValueError, match=match):
    documents.choose_validation(ids, frac)


def test_text_folder_reads_text_jsonl_code_and_reports(tmp_path):
  (tmp_path / 'a.txt').write_text('first document.\nline two\n')
  (tmp_path / 'sub').mkdir()
  (tmp_path / 'sub' / 'code.py').write_text('def f():\n    return 1\n')
  (tmp_path / 'empty.txt').write_text('')
  (tmp_path / 'bad.txt').write_bytes(b'caf\xe9 au lait')  # latin-1, not UTF-8
  (tmp_path / 'image.bin').write_bytes(b'\x00\x01')
  (tmp_path / '.hidden.txt').write_text('ignored')
  lines = [json.dumps({'text': 'json one'}), 'not json', json.dumps({'other': 'x'}), '',
           json.dumps({'text': 'json two'})]
  (tmp_path / 'data.jsonl').write_text('\n'.join(lines) + '\n')
  report = documents.BuildReport()
  docs = list(text_folder.iter_documents(str(tmp_path), 'text', report))
  assert docs == [('a.txt', 'first document.\nline two\n'),
                  ('bad.txt', 'caf\ufffd au lait'),
                  ('data.jsonl:1', 'json one'),
                  ('data.jsonl:5', 'json two'),
                  ('empty.txt', ''),
                  ('sub/code.py', 'def f():\n    return 1\n')]
  assert report.undecodable == {'bad.txt': 1}
  assert report.bad_json_lines == 2
  assert report.ignored_files == 1
  splits = documents.assign_splits(docs, 0.3, report)
  assert report.empty_skipped == ['empty.txt']
  kept = sorted(splits['train'] + splits['validation'])
  assert kept == sorted(d for d in docs if d[1])
  assert report.documents['validation'] == round(0.3 * 5) == len(splits['validation'])
  assert any('undecodable' in w for w in report.warnings())
  assert any('empty' in w for w in report.warnings())


def test_text_folder_errors(tmp_path):
  with pytest.raises(ValueError, match='text_dir is empty'):
    text_folder.list_files('')
  with pytest.raises(ValueError, match='is not a directory'):
    text_folder.list_files(str(tmp_path / 'missing'))


def test_fingerprint_changes_with_content(tmp_path):
  (tmp_path / 'a.txt').write_text('one')
  fp = text_folder.fingerprint(str(tmp_path), 'text', 0.1)
  assert fp == text_folder.fingerprint(str(tmp_path), 'text', 0.1)
  assert fp != text_folder.fingerprint(str(tmp_path), 'text', 0.2)
  (tmp_path / 'b.txt').write_text('two')
  assert fp != text_folder.fingerprint(str(tmp_path), 'text', 0.1)
