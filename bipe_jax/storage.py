"""The one storage module of the library, at the bottom of its house (docs/layout.md): every file
that a library function, a command line or a benchmark reads or writes, a local path or
`gs://bucket/...` alike, goes through here, and this module imports nothing of bipe_jax. Only
two kinds of file bypass it, each taking the same URLs itself: Orbax writes the checkpoints'
arrays through tensorstore, and array_record reads the datasets' record files natively.

What goes through here: a workdir's files (config.json, position_stats.json, metrics.jsonl,
tokenizer.model, library logs, TensorBoard events, the listing and quarantine of its
checkpoints), the data_dir (built datasets, their tokenizers and build reports), text and
Pile-format folders, SCROLLS jsonl files, and every result: JSON documents (`write_json`), plots
(`save_figure`: a matplotlib figure rendered into a buffer, then written), CHE cells and grids,
the visualize pictures, Hugging Face exports, benchmark records, logs appended in parts
(`open_append`). Writes are whole or nothing: a local file is written to a temporary file, then
renamed over the old one; on an object store a single object write is already atomic. Writers
create the folders they need (on a bucket a folder is only a prefix of object names).
A plain `open`, `os.makedirs` or `savefig(path)` on `gs://b/x` would write a local folder named
`gs:` instead; tests/runs/test_outputs_in_bucket.py runs the writing command lines against a GCS
emulator and fails if one appears.

gs:// is served by gcsfs (pinned in requirements.txt). Its newest releases route the `gcs`
protocol to an "extended" filesystem that first asks the Storage Control API over gRPC for the
bucket's layout (zonal / hierarchical); against a server without that API (an emulator, a
proxy) each bucket then waits for the gRPC timeout. This library needs none of those bucket
kinds' extras, so `gs://` and `gcs://` are bound to gcsfs's plain JSON-API filesystem
(`gcsfs.core.GCSFileSystem`) before first use, with bounded retries
(`bipe_jax.storage_gcs.BoundedGCSFileSystem`: a bucket that does not answer is one line naming
it and the endpoint, bipe_jax.storage_faults).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from typing import IO

from etils import epath
import fsspec

PLAIN_GCSFS = 'bipe_jax.storage_gcs.BoundedGCSFileSystem'  # gcsfs.core.GCSFileSystem, bounded
# gcsfs reads this when imported: its plain filesystem for `gcsfs.GCSFileSystem` too
os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')
for _protocol in ('gs', 'gcs'):
  if fsspec.registry.get(_protocol) is None:  # not yet imported nor replaced (tests may)
    fsspec.register_implementation(_protocol, PLAIN_GCSFS, clobber=True)


def follow_storage_emulator(environ=None) -> dict:
  """With STORAGE_EMULATOR_HOST set (a GCS emulator, the variable gcsfs reads), points the
  other two GCS clients of a run at it too: array_record's reader (google-cloud-cpp:
  CLOUD_STORAGE_EMULATOR_ENDPOINT) and Orbax's tensorstore (TENSORSTORE_GCS_HTTP_URL, with the
  fixed test token an emulator accepts). Variables already set are kept. Returns what it set."""
  environ = os.environ if environ is None else environ
  host = environ.get('STORAGE_EMULATOR_HOST', '')
  if not host:
    return {}
  url = host if '://' in host else f'http://{host}'
  wanted = {'CLOUD_STORAGE_EMULATOR_ENDPOINT': url, 'TENSORSTORE_GCS_HTTP_URL': url,
            'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'emulator'}
  added = {k: v for k, v in wanted.items() if k not in environ}
  environ.update(added)
  return added


follow_storage_emulator()


def is_local(path) -> bool:
  """False for a URL of a filesystem such as gs:// (no flock, no rename, no abspath there)."""
  return '://' not in os.fspath(path)


def absolute(path: str) -> str:
  """`path` made absolute (a local path, `~` expanded); URLs are returned as given."""
  return os.path.abspath(os.path.expanduser(path)) if is_local(path) else path


def join(*parts) -> str:
  """os.path.join, which is right for URLs too ('gs://b/run', 'x' -> 'gs://b/run/x')."""
  return os.path.join(*(os.fspath(p) for p in parts))


def exists(path) -> bool:
  return epath.Path(path).exists()


def size_and_mtime(path) -> tuple[int, float]:
  """(bytes, modification time in seconds since the epoch) of a file or object; local files
  keep the file system's sub-second time (epath's stat rounds to seconds)."""
  if is_local(path):
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns / 1e9
  st = epath.Path(path).stat()
  return st.length, float(st.mtime)


def mtime(path) -> float:
  """Modification time (seconds since the epoch) of a file or object."""
  return size_and_mtime(path)[1]


def glob(folder, pattern: str) -> list[str]:
  """Paths (as strings) in `folder` matching the glob `pattern` (e.g. '*/dataset_info.json')."""
  return sorted(os.fspath(p) for p in epath.Path(folder).glob(pattern))


def walk_files(folder) -> list[tuple[str, int, float]]:
  """(relative path with '/', size in bytes, mtime) of every file under `folder`, sorted; names
  starting with '.' (and everything under such folders) are left out."""
  out = []

  def visit(directory: epath.Path, prefix: str):
    for child in directory.iterdir():
      if child.name.startswith('.'):
        continue
      if child.is_dir():
        visit(child, f'{prefix}{child.name}/')
      else:
        out.append((prefix + child.name, *size_and_mtime(os.fspath(child))))

  visit(epath.Path(folder), '')
  return sorted(out)


def read_bytes(path) -> bytes:
  return epath.Path(path).read_bytes()


def open_read(path) -> IO[bytes]:
  """`path` (a local file or an object) opened to read bytes as a stream: for files too large
  to read whole (`read_bytes`)."""
  return epath.Path(path).open('rb')


def rmtree(path) -> None:
  epath.Path(path).rmtree()


def remove(path) -> None:
  """Removes the file or folder (with its contents) `path`."""
  if isdir(path):
    rmtree(path)
  else:
    epath.Path(path).unlink()


def move(source, destination) -> None:
  """Moves a file or a folder (on an object store: copies its objects, then deletes them)."""
  epath.Path(source).rename(destination)


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


DAMAGED_REMEDY = 'restore it from a copy, or remove it'


def read_json(path, *, remedy: str = DAMAGED_REMEDY) -> dict | None:
  """The JSON object in `path`, or None when there is no such file; DamagedFileError (one line
  naming the file and what to do: `remedy`) when it is not valid JSON."""
  p = epath.Path(path)
  if not p.is_file():
    return None
  try:
    return json.loads(p.read_text(encoding='utf-8'))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    reason = (f'{e.msg} at line {e.lineno} column {e.colno}'
              if isinstance(e, json.JSONDecodeError) else str(e))
    raise DamagedFileError(f'{path} is not valid JSON ({reason}): the file is damaged or '
                           f'truncated; {remedy}') from None


def write_bytes_atomic(path, data: bytes) -> str:
  """Writes `data` to `path` so that a reader never sees half a file; creates the folder.
  Returns the path."""
  path = os.fspath(path)
  if not is_local(path):
    p = epath.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return path
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'wb') as f:
    f.write(data)
  os.replace(tmp, path)
  return path


def write_text_atomic(path, text: str) -> str:
  """`write_bytes_atomic` of `text` in UTF-8."""
  return write_bytes_atomic(path, text.encode('utf-8'))


def write_json(path, document, *, indent: int | None = 2, sort_keys: bool = False) -> str:
  """`document` as JSON into `path` (`write_text_atomic`; indent None: one line); returns the
  path."""
  return write_text_atomic(path, json.dumps(document, indent=indent, sort_keys=sort_keys))


def save_figure(fig, path, **savefig_kwargs) -> str:
  """A matplotlib figure as PNG into `path` (local or gs://...); returns the path."""
  import io  # pylint: disable=import-outside-toplevel
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', **savefig_kwargs)
  return write_bytes_atomic(path, buffer.getvalue())


def copy_file(source, destination) -> None:
  """Copies `source` to `destination` (either may be a URL); atomic on a local destination, so
  processes sharing a workdir that copy the same bytes never see a partial file."""
  destination = os.fspath(destination)
  if not is_local(destination):  # streamed: record shards may not fit in memory
    epath.Path(destination).parent.mkdir(parents=True, exist_ok=True)
    with epath.Path(source).open('rb') as src, epath.Path(destination).open('wb') as dst:
      shutil.copyfileobj(src, dst, 1 << 24)
    return
  write_bytes_atomic(destination, read_bytes(source))


def copy_tree(source, destination, *, last: tuple = ()) -> None:
  """Copies every file under the folder `source` to the same place under `destination`; the
  files named in `last` (e.g. the marker a reader looks for) are copied after all others."""
  files = [rel for rel, _, _ in walk_files(source)]
  for rel in sorted(files, key=lambda rel: os.path.basename(rel) in last):
    copy_file(join(source, rel), join(destination, rel))


@contextlib.contextmanager
def local_staging(path):
  """A local folder to write what belongs in `path`: `path` itself when local, else a temporary
  folder (deleted afterwards) for writers that only write local files (array_record)."""
  if is_local(path):
    yield path
    return
  with tempfile.TemporaryDirectory(prefix='bipe_jax_staging_') as folder:
    yield folder


def sha256_of(path) -> str:
  digest = hashlib.sha256()
  with epath.Path(path).open('rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


PART_DIGITS = 6
CHUNK_BYTES = 1 << 20  # a part of an appended object is closed once it holds this much


def part_path(path, index: int) -> str:
  """The object holding part `index` of the appended file `path`: part 0 is `path` itself, part
  k > 0 is `path.00000k` (TensorBoard reads every `*tfevents*` object of a folder in name order,
  so an event file's parts are read as one stream)."""
  path = os.fspath(path)
  return path if index == 0 else f'{path}.{index:0{PART_DIGITS}d}'


def appended_parts(path) -> list[str]:
  """The existing objects of the appended file `path`, in order (see `part_path`)."""
  p = epath.Path(path)
  if not p.parent.exists():
    return []
  indices = []
  for child in p.parent.iterdir():
    if child.name == p.name:
      indices.append(0)
    suffix = child.name[len(p.name) + 1:]
    if (child.name.startswith(p.name + '.') and len(suffix) == PART_DIGITS
        and suffix.isdigit()):
      indices.append(int(suffix))
  return [part_path(path, i) for i in sorted(indices)]


def read_appended(path, *, binary: bool = False):
  """The whole content of a file written by `open_append` (local, or an object's parts)."""
  parts = appended_parts(path) if not is_local(path) else [path] if isfile(path) else []
  data = b''.join(epath.Path(p).read_bytes() for p in parts)
  return data if binary else data.decode('utf-8')


class ChunkedAppender:
  """Appending to an object store (gs://...), where an object cannot be appended to.

  The file is a series of objects (`part_path`): earlier parts are never written again; each
  `flush` writes only the last part, and a part that has reached `chunk_bytes` is closed, so a
  flush costs at most `chunk_bytes`. A run that resumes starts a new part. `min_interval_s` > 0
  makes `flush` wait that long since the last write (`close` always writes): for a log whose
  lines each call flush.
  """

  def __init__(self, path, *, binary: bool = False, chunk_bytes: int = CHUNK_BYTES,
               min_interval_s: float = 0.0):
    self._path = os.fspath(path)
    epath.Path(self._path).parent.mkdir(parents=True, exist_ok=True)
    existing = appended_parts(self._path)
    self._index = (int(existing[-1][len(self._path) + 1:]) + 1 if len(existing) > 1
                   else len(existing))
    self._binary, self._chunk_bytes, self._min_interval = binary, chunk_bytes, min_interval_s
    self._part = bytearray()
    self._dirty, self._written_at = False, None  # None: nothing written yet

  @property
  def path(self) -> str:
    return self._path

  def write(self, data) -> None:
    self._part += data if self._binary else data.encode('utf-8')
    self._dirty = True

  def flush(self, *, force: bool = False) -> None:
    if not self._dirty or (not force and self._written_at is not None
                           and time.monotonic() - self._written_at < self._min_interval):
      return
    epath.Path(part_path(self._path, self._index)).write_bytes(bytes(self._part))
    self._dirty, self._written_at = False, time.monotonic()
    if len(self._part) >= self._chunk_bytes:
      self._index, self._part = self._index + 1, bytearray()

  def close(self) -> None:
    self.flush(force=True)

  def __enter__(self) -> 'ChunkedAppender':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def open_append(path, **chunking) -> IO[str] | ChunkedAppender:
  """`path` opened to append text (created with its folder if missing): a local file, or a
  `ChunkedAppender` on an object store (`chunking`: its keyword arguments)."""
  if not is_local(path):
    return ChunkedAppender(path, **chunking)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  return open(path, 'a', encoding='utf-8')


def rewrite_appended(path, keep) -> int:
  """Keeps the lines of the appended text file `path` for which `keep(line)` is true; rewrites
  only the parts (objects) that lose lines. Returns how many lines were dropped."""
  parts = appended_parts(path) if not is_local(path) else [path] if isfile(path) else []
  dropped = 0
  for part in parts:
    lines = epath.Path(part).read_text(encoding='utf-8').splitlines(keepends=True)
    kept = [line for line in lines if keep(line)]
    if len(kept) != len(lines):
      dropped += len(lines) - len(kept)
      write_text_atomic(part, ''.join(kept))
  return dropped
