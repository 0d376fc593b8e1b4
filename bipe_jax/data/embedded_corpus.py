"""The embedded default corpus: text that exists offline on every machine with CPython.

Prose: the Python reference documentation topics shipped as `pydoc_data.topics` (what `help()`
shows). Code: the standard library's own `.py` files, without its test suites. Documents are
yielded in a fixed order with stable ids (`topic/<name>`, `stdlib/<relative path>`), so the
corpus (and its split) is a function of the Python version only: the builder files it under a
config named after that version (`py311`, ...).
"""

import os
import sys
import sysconfig
from typing import Iterator

from bipe_jax.data import documents

# Folders of the stdlib that are test suites, vendored packages or installed third-party code.
_SKIPPED_DIRS = frozenset({'test', 'tests', 'idle_test', 'site-packages', 'dist-packages',
                           '__pycache__', 'lib2to3'})


def version_tag() -> str:
  """'py311' for CPython 3.11: the embedded corpus differs between Python versions."""
  return f'py{sys.version_info.major}{sys.version_info.minor}'


def stdlib_dir() -> str:
  return sysconfig.get_paths()['stdlib']


def iter_prose() -> Iterator[tuple[str, str]]:
  """(id, text) for every `pydoc_data.topics` entry, sorted by topic name."""
  from pydoc_data import topics  # pylint: disable=import-outside-toplevel
  for name in sorted(topics.topics):
    yield f'topic/{name}', topics.topics[name]


def iter_code(report: documents.BuildReport) -> Iterator[tuple[str, str]]:
  """(id, text) for the standard library's `.py` files in sorted path order, tests excluded."""
  root = stdlib_dir()
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames
                         if d not in _SKIPPED_DIRS and not d.startswith('test'))
    for name in sorted(filenames):
      if not name.endswith('.py') or name.startswith('test_'):
        continue
      path = os.path.join(dirpath, name)
      with open(path, 'rb') as f:
        text, replaced = documents.decode_bytes(f.read())
      doc_id = 'stdlib/' + os.path.relpath(path, root).replace(os.sep, '/')
      if replaced:
        report.undecodable[doc_id] = replaced
      yield doc_id, text


def iter_documents(report: documents.BuildReport) -> Iterator[tuple[str, str]]:
  """All embedded documents: prose first, then code."""
  yield from iter_prose()
  yield from iter_code(report)
