"""Documents from a folder of text (local or gs://...): plain text, JSON lines and source code.

- `.txt`, `.md`, `.rst` (and files without an extension): one document per file.
- `.jsonl`: one document per line, the JSON object's `text_field` (lines that are not JSON
  objects with that string field are skipped and counted).
- source code (`CODE_EXTENSIONS`): one document per file.
Other files are ignored and counted. Bytes that are not UTF-8 are replaced by U+FFFD and
counted per document. The folder's fingerprint (paths, sizes, modification times, options)
names the built dataset, so editing the folder triggers a rebuild instead of serving stale data.
"""

import hashlib
import os
from typing import Iterator

from bipe_jax import storage
from bipe_jax.data import documents

TEXT_EXTENSIONS = ('.txt', '.md', '.rst', '')
JSONL_EXTENSIONS = ('.jsonl',)
CODE_EXTENSIONS = ('.py', '.c', '.h', '.cc', '.cpp', '.hpp', '.java', '.js', '.ts', '.go',
                   '.rs', '.rb', '.sh', '.jl', '.scala', '.kt', '.swift', '.m', '.r', '.lua',
                   '.pl', '.php', '.hs', '.ml', '.sql', '.toml', '.yaml', '.yml', '.tex')


def _kind(path: str) -> str | None:
  ext = os.path.splitext(path)[1].lower()
  if ext in JSONL_EXTENSIONS:
    return 'jsonl'
  if ext in TEXT_EXTENSIONS:
    return 'text'
  if ext in CODE_EXTENSIONS:
    return 'code'
  return None


def list_files(text_dir: str) -> list[str]:
  """Relative paths of every regular file under `text_dir`, sorted, hidden entries skipped."""
  if not text_dir:
    raise ValueError("data.text_dir is empty: set it to a folder of .txt/.jsonl/source files "
                     "for dataset='text_folder'")
  return [rel for rel, _, _ in _files(text_dir)]


def _files(text_dir: str) -> list[tuple[str, int, float]]:
  """(relative path, size, mtime) of every file under `text_dir` (storage.walk_files)."""
  if not storage.isdir(text_dir):
    raise ValueError(f'data.text_dir={text_dir!r} is not a directory')
  return storage.walk_files(text_dir)


def fingerprint(text_dir: str, text_field: str, validation_fraction: float) -> str:
  """A short hash of the folder's files (path, size, mtime) and the build options."""
  h = hashlib.sha1()
  h.update(f'{storage.absolute(text_dir)}|{text_field}|{validation_fraction}'.encode())
  for rel, size, mtime in _files(text_dir):
    h.update(f'|{rel}|{size}|{round(mtime * 1e9)}'.encode())
  return h.hexdigest()[:12]


def iter_documents(text_dir: str, text_field: str,
                   report: documents.BuildReport) -> Iterator[tuple[str, str]]:
  """(id, text) for every document of the folder, in sorted path (then line) order."""
  for rel in list_files(text_dir):
    kind = _kind(rel)
    if kind is None:
      report.ignored_files += 1
      continue
    data = storage.read_bytes(storage.join(text_dir, rel))
    doc_id = rel
    if kind != 'jsonl':
      text, replaced = documents.decode_bytes(data)
      if replaced:
        report.undecodable[doc_id] = replaced
      yield doc_id, text
      continue
    for lineno, raw in enumerate(data.split(b'\n'), start=1):
      record = documents.json_record(raw, text_field, report)
      if record is None:
        continue
      obj, replaced = record
      line_id = f'{doc_id}:{lineno}'
      if replaced:
        report.undecodable[line_id] = replaced
      yield line_id, obj[text_field]
