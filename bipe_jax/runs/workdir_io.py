"""Reading and writing a run's workdir through `etils.epath`, as Orbax does for checkpoints: a
local folder or a bucket (`gs://bucket/run`, any epath backend) alike.

Every file of a workdir outside the checkpoints (config.json, position_stats.json,
metrics.jsonl, tokenizer.model) and the listing of the checkpoints go through here.
Local files are replaced atomically (a temporary file, then a rename); on an object store a
single object write is already atomic, so the file is written directly.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import IO

from etils import epath


def is_local(path) -> bool:
  """False for a URL of a filesystem such as gs:// (no flock, no rename, no abspath there)."""
  return '://' not in os.fspath(path)


def absolute(path: str) -> str:
  """`path` made absolute (a local path, `~` expanded); URLs are returned as given."""
  return os.path.abspath(os.path.expanduser(path)) if is_local(path) else path


def isfile(path) -> bool:
  return epath.Path(path).is_file()


def isdir(path) -> bool:
  return epath.Path(path).is_dir()


def listdir(path) -> list[str]:
  """Names in the folder `path` (not full paths)."""
  return [p.name for p in epath.Path(path).iterdir()]


def makedirs(path) -> None:
  epath.Path(path).mkdir(parents=True, exist_ok=True)


class DamagedFileError(ValueError):
  """A run's file that exists but cannot be read (truncated, not JSON); one line naming it."""


def read_json(path) -> dict | None:
  """The JSON object in `path`, or None when there is no such file; DamagedFileError (one line
  naming the file) when it is not valid JSON."""
  p = epath.Path(path)
  if not p.is_file():
    return None
  try:
    return json.loads(p.read_text(encoding='utf-8'))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    reason = (f'{e.msg} at line {e.lineno} column {e.colno}'
              if isinstance(e, json.JSONDecodeError) else str(e))
    raise DamagedFileError(f'{path} is not valid JSON ({reason}): the file is damaged or '
                           'truncated; restore it from a copy, or remove it') from None


def write_text_atomic(path, text: str) -> str:
  """Writes `text` to `path` so that a reader never sees half a file; creates the folder.
  Returns the path."""
  path = os.fspath(path)
  if not is_local(path):
    p = epath.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding='utf-8')
    return path
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write(text)
  os.replace(tmp, path)
  return path


def copy_file(source, destination) -> None:
  """Copies `source` to `destination` (either may be a URL); atomic on a local destination, so
  processes sharing a workdir that copy the same bytes never see a partial file."""
  destination = os.fspath(destination)
  if not is_local(destination):
    epath.Path(destination).parent.mkdir(parents=True, exist_ok=True)
    epath.Path(source).copy(destination, overwrite=True)
    return
  os.makedirs(os.path.dirname(os.path.abspath(destination)), exist_ok=True)
  tmp = f'{destination}.{os.getpid()}.tmp'
  with open(tmp, 'wb') as f:
    f.write(epath.Path(source).read_bytes())
  os.replace(tmp, destination)


def sha256_of(path) -> str:
  digest = hashlib.sha256()
  with epath.Path(path).open('rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


class RewritingAppender:
  """Appending to an object (gs://...), which cannot be appended to: keeps the content and
  rewrites the whole object at each `flush` (and `close`). For small, slowly growing files
  (metrics.jsonl, TensorBoard events of a run's scalars)."""

  def __init__(self, path, *, binary: bool = False):
    self._path = epath.Path(path)
    self._path.parent.mkdir(parents=True, exist_ok=True)
    empty = b'' if binary else ''
    if self._path.exists():
      self._content = self._path.read_bytes() if binary else self._path.read_text()
    else:
      self._content = empty
    self._binary, self._dirty = binary, False

  def write(self, data) -> None:
    self._content += data
    self._dirty = True

  def flush(self) -> None:
    if self._dirty:
      if self._binary:
        self._path.write_bytes(self._content)
      else:
        self._path.write_text(self._content, encoding='utf-8')
      self._dirty = False

  def close(self) -> None:
    self.flush()


def open_append(path) -> IO[str] | RewritingAppender:
  """`path` opened to append text (created with its folder if missing): a local file, or a
  `RewritingAppender` on an object store."""
  if not is_local(path):
    return RewritingAppender(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  return open(path, 'a', encoding='utf-8')
