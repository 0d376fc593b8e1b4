"""Documents before tokenisation: decoding with counted replacements, and the train/validation split.

Pure Python helpers shared by the embedded corpus and the text-folder builder. A document is a
`(doc_id, text)` pair; `doc_id` is stable across machines (a relative path, a topic name, a
`path:line` for JSON lines) so the split does not depend on file-system order.
"""

import codecs
import collections
import dataclasses
import hashlib
import json
import threading
from typing import Iterable, Sequence

SPLITS = ('train', 'validation')


@dataclasses.dataclass
class BuildReport:
  """What a builder saw: kept documents per split and everything it skipped or repaired."""
  documents: dict = dataclasses.field(default_factory=lambda: collections.Counter())
  characters: dict = dataclasses.field(default_factory=lambda: collections.Counter())
  empty_skipped: list = dataclasses.field(default_factory=list)
  undecodable: dict = dataclasses.field(default_factory=dict)  # doc_id -> bytes replaced
  ignored_files: int = 0
  bad_json_lines: int = 0

  def as_dict(self) -> dict:
    return {
        'documents': dict(self.documents),
        'characters': dict(self.characters),
        'empty_skipped': len(self.empty_skipped),
        'empty_skipped_examples': self.empty_skipped[:10],
        'undecodable_documents': len(self.undecodable),
        'undecodable_bytes_replaced': int(sum(self.undecodable.values())),
        'undecodable_examples': dict(list(self.undecodable.items())[:10]),
        'ignored_files': self.ignored_files,
        'bad_json_lines': self.bad_json_lines,
    }

  def warnings(self) -> list[str]:
    """Human-readable lines for what was skipped or repaired (empty when nothing was)."""
    out = []
    if self.empty_skipped:
      out.append(f'skipped {len(self.empty_skipped)} empty document(s), e.g. '
                 f'{self.empty_skipped[:3]}')
    if self.undecodable:
      out.append(f'replaced {sum(self.undecodable.values())} undecodable byte sequence(s) with '
                 f'U+FFFD in {len(self.undecodable)} document(s), e.g. '
                 f'{list(self.undecodable)[:3]}')
    if self.bad_json_lines:
      out.append(f'skipped {self.bad_json_lines} JSON line(s) that were not valid JSON objects '
                 'with the text field')
    return out


_COUNTER = threading.local()


def _count_and_replace(err: UnicodeDecodeError):
  _COUNTER.replaced += 1
  return '\ufffd', err.end


codecs.register_error('bipe_count_replace', _count_and_replace)


def decode_bytes(data: bytes) -> tuple[str, int]:
  """UTF-8 decodes `data`, replacing undecodable sequences by U+FFFD; returns (text, replaced)."""
  _COUNTER.replaced = 0
  text = data.decode('utf-8', errors='bipe_count_replace')
  return text, _COUNTER.replaced


def json_record(raw: bytes, text_field: str, report: BuildReport) -> tuple[dict, int] | None:
  """(object, bytes replaced) of one JSON line whose `text_field` is a string; None for a blank
  line, and for a line that is not such an object (counted in `report.bad_json_lines`)."""
  if not raw.strip():
    return None
  line, replaced = decode_bytes(raw)
  try:
    obj = json.loads(line)
  except json.JSONDecodeError:
    obj = None
  if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
    report.bad_json_lines += 1
    return None
  return obj, replaced


def split_of(doc_id: str, validation_ids: frozenset) -> str:
  return 'validation' if doc_id in validation_ids else 'train'


def choose_validation(doc_ids: Sequence[str], validation_fraction: float) -> frozenset:
  """The validation documents: the `round(fraction * n)` ids (at least 1) with the smallest hash.

  Deterministic for a set of ids whatever their order, and stable when unrelated documents
  are added (a document's rank depends on its own hash). Needs at least 2 documents.
  """
  if not 0.0 < validation_fraction < 1.0:
    raise ValueError(f'validation_fraction must be in (0, 1), got {validation_fraction}')
  ids = sorted(set(doc_ids))
  if len(ids) != len(doc_ids):
    raise ValueError('document ids must be unique')
  if len(ids) < 2:
    raise ValueError(f'need at least 2 documents to split into train and validation, got '
                     f'{len(ids)}')
  n_val = min(len(ids) - 1, max(1, round(validation_fraction * len(ids))))
  ranked = sorted(ids, key=lambda i: hashlib.sha1(i.encode('utf-8')).hexdigest())
  return frozenset(ranked[:n_val])


def assign_splits(docs: Iterable[tuple[str, str]], validation_fraction: float,
                  report: BuildReport) -> dict:
  """{'train': [(id, text)], 'validation': [...]}; empty (whitespace-only) documents skipped."""
  kept = []
  for doc_id, text in docs:
    if not text.strip():
      report.empty_skipped.append(doc_id)
      continue
    kept.append((doc_id, text))
  val = choose_validation([d for d, _ in kept], validation_fraction)
  out = {s: [] for s in SPLITS}
  for doc_id, text in kept:
    split = split_of(doc_id, val)
    out[split].append((doc_id, text))
    report.documents[split] += 1
    report.characters[split] += len(text)
  return out
