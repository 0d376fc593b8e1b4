"""The project's files cite only the project's own files: no document outside the repository."""

import os
import re
from tests import fixtures

ROOT = fixtures.ROOT
OUTSIDE = re.compile(r'PERFORMANCE\.md|ARCHITECTURE\.md|REFERENCE(\.md| §)|/work/shared|'
                     r'\.\./shared/')
SKIP_DIRS = {'.git', '.venv', 'node_modules', '__pycache__', 'demo_out', 'data_cache', 'runs'}
TEXT = ('.py', '.md', '.txt', '.toml', '.cfg', '.yaml', '.yml', 'Makefile')


def outside_references(root: str = ROOT) -> list[str]:
  """'path:line: text' of every line citing a document outside the repository."""
  found = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith('.')]
    for name in files:
      path = os.path.join(folder, name)
      if not name.endswith(TEXT) or path == os.path.abspath(__file__):
        continue
      with open(path, encoding='utf-8', errors='replace') as f:
        for number, line in enumerate(f, 1):
          if OUTSIDE.search(line):
            found.append(f'{os.path.relpath(path, root)}:{number}: {line.strip()}')
  return found


def test_no_file_cites_a_document_outside_the_repository():
  assert outside_references() == []


def test_the_check_finds_such_a_citation(tmp_path):
  (tmp_path / 'a.py').write_text('"""See PERFORMANCE.md and REFERENCE §1."""\n')
  (tmp_path / 'b.md').write_text('fine\n')
  assert outside_references(str(tmp_path)) == ['a.py:1: """See PERFORMANCE.md and REFERENCE §1."""']
