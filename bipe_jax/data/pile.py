"""Documents of a folder in the Pile's format: JSON lines (`.jsonl` or `.jsonl.zst`), one record
per line, `{"text": "...", "meta": {"pile_set_name": "ArXiv", ...}}`.

The BiPE paper pretrains on the Pile (uncopyrighted) and evaluates on its PG-19, ArXiv and Github
validation subsets. The released folders (the Pile, monology/pile-uncopyrighted) look like

    <pile_dir>/train/00.jsonl.zst ... 29.jsonl.zst
    <pile_dir>/val.jsonl.zst
    <pile_dir>/test.jsonl.zst

A file's split comes from its path: under a folder named `train`, `val` / `validation` or `test`,
or a file whose name starts with one of them (`val.jsonl.zst`, `train_00.jsonl`); other files
are ignored and counted. `data.pile_subsets` keeps only the records whose `meta.pile_set_name`
is one of the listed subsets ('' = every record); the three evaluation subsets have short
aliases (`EVAL_SUBSETS`: pg19, arxiv, github). A record that is not a JSON object with a string
`text` (or, with a subset selection, without a string `meta.pile_set_name`) is skipped and
counted. Paths go through bipe_jax.storage (a local folder or a bucket).
"""

import collections
import hashlib
import io
import os
import re
from typing import Iterator

from bipe_jax import storage
from bipe_jax.data import documents

# Every `meta.pile_set_name` of the Pile (Gao et al. 2020, table 1); the uncopyrighted release
# drops Books3, BookCorpus2, OpenSubtitles and YoutubeSubtitles.
PILE_SUBSETS = (
    'Pile-CC', 'PubMed Central', 'Books3', 'OpenWebText2', 'ArXiv', 'Github', 'FreeLaw',
    'StackExchange', 'USPTO Backgrounds', 'PubMed Abstracts', 'Gutenberg (PG-19)',
    'OpenSubtitles', 'Wikipedia (en)', 'DM Mathematics', 'Ubuntu IRC', 'BookCorpus2',
    'EuroParl', 'HackerNews', 'YoutubeSubtitles', 'PhilPapers', 'NIH ExPorter', 'Enron Emails')
# The paper's evaluation subsets, by the names its tables use.
EVAL_SUBSETS = {'pg19': 'Gutenberg (PG-19)', 'arxiv': 'ArXiv', 'github': 'Github'}
SPLIT_NAMES = {'train': 'train', 'val': 'validation', 'validation': 'validation',
               'test': 'test'}
EXTENSIONS = ('.jsonl', '.jsonl.zst')
# The Pile's .zst files were written with long windows; zstd refuses them under its default
# 128 MiB limit.
ZSTD_MAX_WINDOW = 2 ** 31


def parse_subsets(value: str) -> tuple[str, ...]:
  """The `meta.pile_set_name`s selected by `data.pile_subsets` (comma-separated names or
  aliases; '' = all), sorted; a ValueError naming an unknown one."""
  out = set()
  for raw in str(value).split(','):
    name = raw.strip()
    if not name:
      continue
    name = EVAL_SUBSETS.get(name.lower(), name)
    if name not in PILE_SUBSETS:
      raise ValueError(f'data.pile_subsets={value!r}: {raw.strip()!r} is not a Pile subset; '
                       f'use one of {", ".join(PILE_SUBSETS)} or an alias '
                       f'({", ".join(EVAL_SUBSETS)})')
    out.add(name)
  return tuple(sorted(out))


def parse_splits(value: str) -> tuple[str, ...]:
  """The splits a Pile dataset is built with (`data.pile_splits`, comma-separated)."""
  out = []
  for raw in str(value).split(','):
    name = SPLIT_NAMES.get(raw.strip().lower()) if raw.strip() else None
    if raw.strip() and name is None:
      raise ValueError(f'data.pile_splits={value!r}: {raw.strip()!r} is not one of '
                       'train, validation, test')
    if name and name not in out:
      out.append(name)
  if not out:
    raise ValueError(f'data.pile_splits={value!r} names no split (train, validation, test)')
  return tuple(out)


def split_of_path(rel: str) -> str | None:
  """'train' | 'validation' | 'test' for a relative path of the folder, None for another file."""
  if not rel.endswith(EXTENSIONS):
    return None
  parts = rel.replace(os.sep, '/').split('/')
  for folder in parts[:-1]:
    if folder.lower() in SPLIT_NAMES:
      return SPLIT_NAMES[folder.lower()]
  match = re.match(r'([a-z]+)', parts[-1].lower())
  return SPLIT_NAMES.get(match.group(1)) if match else None


def resolve(pile_dir: str) -> str:
  """`pile_dir` absolute (a bucket URL such as gs://... kept)."""
  return storage.absolute(pile_dir)


def list_files(pile_dir: str) -> list[tuple[str, int, int]]:
  """(relative path, size, mtime) of every regular file under `pile_dir`, sorted."""
  if not pile_dir:
    raise ValueError("data.pile_dir is empty: set it to a folder of the Pile's .jsonl(.zst) "
                     "files for dataset='pile'")
  root = resolve(pile_dir)
  if not storage.isdir(root):
    raise ValueError(f'data.pile_dir={pile_dir!r} is not a directory')
  # storage's walk (hidden entries skipped), not epath's: on gs:// that yields folders
  # without their gs:// prefix.
  return [(rel, int(size), int(mtime)) for rel, size, mtime in storage.walk_files(root)]


def split_files(pile_dir: str, splits) -> dict:
  """{split: [relative paths]} for `splits`; a ValueError when a wanted split has no file."""
  found = collections.defaultdict(list)
  for rel, _, _ in list_files(pile_dir):
    split = split_of_path(rel)
    if split is not None:
      found[split].append(rel)
  missing = [s for s in splits if not found.get(s)]
  if missing:
    raise ValueError(f'data.pile_dir={pile_dir!r} has no .jsonl / .jsonl.zst file for split(s) '
                     f'{missing} (expected e.g. train/00.jsonl.zst, val.jsonl.zst, '
                     'test.jsonl.zst)')
  return {s: found[s] for s in splits}


def fingerprint(pile_dir: str, subsets, splits) -> str:
  """A short hash of the folder's files (path, size, mtime) and the selection."""
  h = hashlib.sha1(f'{resolve(pile_dir)}|{",".join(subsets)}|{",".join(splits)}'.encode())
  for rel, size, mtime in list_files(pile_dir):
    h.update(f'|{rel}|{size}|{mtime}'.encode())
  return h.hexdigest()[:12]


def config_name(pile_dir: str, subsets, splits) -> str:
  """'<subsets or all>_<splits>_<fingerprint>': the dataset's folder name."""
  label = '+'.join(subsets) if subsets else 'all'
  label = re.sub(r'[^A-Za-z0-9+-]+', '_', label).strip('_')[:60]
  split_label = '+'.join('val' if s == 'validation' else s for s in splits)
  return f'{label}_{split_label}_{fingerprint(pile_dir, subsets, splits)}'


def open_lines(path) -> Iterator[bytes]:
  """The lines (bytes, newline stripped) of a .jsonl or .jsonl.zst file, streamed."""
  with storage.open_read(path) as raw:
    if str(path).endswith('.zst'):
      import zstandard  # pylint: disable=g-import-not-at-top (only for compressed folders)
      stream = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).stream_reader(raw)
      lines = io.BufferedReader(stream, buffer_size=1 << 20)
    else:
      lines = raw
    for line in lines:
      yield line.rstrip(b'\r\n')


class PileReport(documents.BuildReport):
  """A BuildReport that also counts documents per subset and split, and the records left out."""

  def __init__(self):
    super().__init__()
    self.subset_documents = collections.Counter()  # 'split/subset' -> documents
    self.other_subsets = 0  # records of subsets not selected
    self.missing_subset = 0  # records without meta.pile_set_name under a selection

  def as_dict(self) -> dict:
    out = super().as_dict()
    out['subset_documents'] = dict(sorted(self.subset_documents.items()))
    out['records_of_other_subsets'] = self.other_subsets
    out['records_without_pile_set_name'] = self.missing_subset
    return out

  def warnings(self) -> list[str]:
    out = super().warnings()
    if self.missing_subset:
      out.append(f'skipped {self.missing_subset} record(s) without a string '
                 'meta.pile_set_name (a subset was selected)')
    return out


def iter_documents(pile_dir: str, files, split: str, subsets, text_field: str,
                   report: PileReport) -> Iterator[tuple[str, str]]:
  """(id 'path:line', text) of the selected records of `files`, in file then line order."""
  wanted = frozenset(subsets)
  for rel in files:
    for lineno, raw in enumerate(open_lines(storage.join(resolve(pile_dir), rel)), start=1):
      record = documents.json_record(raw, text_field, report)
      if record is None:
        continue
      obj, replaced = record
      meta = obj.get('meta')
      name = meta.get('pile_set_name') if isinstance(meta, dict) else None
      if wanted and not isinstance(name, str):
        report.missing_subset += 1
        continue
      if wanted and name not in wanted:
        report.other_subsets += 1
        continue
      text = obj[text_field]
      doc_id = f'{rel}:{lineno}'
      if not text.strip():
        report.empty_skipped.append(doc_id)
        continue
      if replaced:
        report.undecodable[doc_id] = replaced
      report.documents[split] += 1
      report.characters[split] += len(text)
      report.subset_documents[f'{split}/{name if isinstance(name, str) else "?"}'] += 1
      yield doc_id, text
