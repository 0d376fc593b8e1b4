"""Every fenced code block of README.md runs as written, and every relative link of README.md and
docs/*.md resolves, its #anchor included.

- Python blocks run here, all in one subprocess (`python -m tests.project.readme_checks`), each
  as a script in a fresh namespace, in a temporary directory where `runs/tiny` is the suite's
  trained tiny bipe_rope run (fixtures.trained_run: what the README's training command makes,
  smaller). Then the check of the block's heading (readme_checks.CHECKS) tests what it computed:
  causality and BiPE's segments for the linen and NNX layers, a loss and a gradient for every
  parameter of the decoder, and for generation that a left-padded prompt continues exactly as
  it does alone.
- Shell blocks: every `python ...` command of them is run by test_readme_recipes.py (which runs
  all of them in README order, shrunk by flags: its SHRINK must know the script, checked here);
  every other line must be in RUN_ELSEWHERE, which names where it runs, checked to be there.
- A block in another language, or a shell line neither covers, fails here.
"""

import json
import os
import re
import shlex
import sys
import unicodedata

from tests import fixtures
from tests import forkserver
from tests.project import readme_checks
from tests.project.test_readme_recipes import SHRINK

ROOT = fixtures.ROOT
README = os.path.join(ROOT, 'README.md')

# Shell lines of README.md that no test here runs, each with where it runs: (file, text the file
# must contain) pairs, checked by test_every_shell_line_is_run_somewhere.
RUN_ELSEWHERE = {
    # .ci/run runs `make test`, whose prerequisite is everything `make setup` installs.
    'make setup': (('.ci/run', 'make test'), ('Makefile', 'setup: $(TEST_STAMP)'),
                   ('Makefile', 'test: $(TEST_STAMP)')),
    # test_readme_recipes.py runs the Makefile's command for it, shrunk (the demo takes 8-14 min).
    'make demo': (('tests/project/test_readme_recipes.py', "makefile_command('demo')"),
                  ('Makefile', 'demo: $(CORE_STAMP)')),
    'make test': (('.ci/run', 'make test'),),
}


def fenced_blocks(text: str) -> list[dict]:
  """[{'lang', 'code', 'line' (of its first code line, 1-based), 'heading' (the last markdown
  heading above it)}] of every fenced block of `text`, in order."""
  blocks, heading, current = [], '', None
  for number, line in enumerate(text.splitlines(), 1):
    if current is None:
      if line.startswith('```'):
        current = {'lang': line[3:].strip(), 'code': [], 'line': number + 1, 'heading': heading}
      elif line.startswith('#'):
        heading = line.strip()
    elif line.startswith('```'):
      blocks.append(dict(current, code='\n'.join(current['code']) + '\n'))
      current = None
    else:
      current['code'].append(line)
  assert current is None, f'a code block opened at line {current["line"] - 1} is never closed'
  return blocks


def shell_lines(code: str) -> list[list[str]]:
  """argv of every command line of a shell block (continuations joined, comments dropped)."""
  return [argv for line in code.replace('\\\n', ' ').splitlines()
          if (argv := shlex.split(line, comments=True))]


def uncovered(blocks: list[dict]) -> list[str]:
  """What no test runs: blocks in another language and shell lines that are neither a python
  command test_readme_recipes.py runs nor in RUN_ELSEWHERE."""
  found = []
  for block in blocks:
    where = f'README.md:{block["line"]}'
    if block['lang'] == 'python':
      continue
    if block['lang'] != 'bash':
      found.append(f'{where}: a ```{block["lang"]} block (only python and bash blocks are run)')
      continue
    for argv in shell_lines(block['code']):
      if argv[0].endswith('python'):
        if argv[1] not in SHRINK:
          found.append(f'{where}: {" ".join(argv)}: test_readme_recipes.py has no size for it')
      elif ' '.join(argv) not in RUN_ELSEWHERE:
        found.append(f'{where}: {" ".join(argv)}: not run by any test (RUN_ELSEWHERE)')
  return found


def test_every_shell_line_is_run_somewhere():
  blocks = fenced_blocks(open(README, encoding='utf-8').read())
  assert uncovered(blocks) == []
  lines = {' '.join(argv) for b in blocks if b['lang'] == 'bash' for argv in shell_lines(b['code'])}
  assert set(RUN_ELSEWHERE) <= lines, 'RUN_ELSEWHERE names lines the README no longer has'
  for line, places in RUN_ELSEWHERE.items():
    for path, text in places:
      with open(os.path.join(ROOT, path), encoding='utf-8') as f:
        assert text in f.read(), f'{line!r} is said to run through {path}, which lacks {text!r}'


def test_the_block_check_finds_what_no_test_runs():
  text = ('# T\n```bash\nmake test\n.venv/bin/python eval/unknown.py --x=1\nrm -rf runs\n```\n'
          '```sh\nls\n```\n```python\nx = 1\n```\n')
  blocks = fenced_blocks(text)
  assert [(b['lang'], b['line'], b['heading']) for b in blocks] == [
      ('bash', 3, '# T'), ('sh', 8, '# T'), ('python', 11, '# T')]
  assert uncovered(blocks) == [
      'README.md:3: .venv/bin/python eval/unknown.py --x=1: test_readme_recipes.py has no size '
      'for it',
      'README.md:3: rm -rf runs: not run by any test (RUN_ELSEWHERE)',
      'README.md:8: a ```sh block (only python and bash blocks are run)']


def test_every_python_block_runs_and_computes_what_it_says(tmp_path, trained_run):
  blocks = [b for b in fenced_blocks(open(README, encoding='utf-8').read())
            if b['lang'] == 'python']
  headings = {b['heading'] for b in blocks}
  assert set(readme_checks.CHECKS) <= headings, 'a check of readme_checks.py finds no block'
  (tmp_path / 'runs').mkdir()
  os.symlink(trained_run, tmp_path / 'runs' / 'tiny')  # the README's `runs/tiny`
  with open(tmp_path / 'blocks.json', 'w', encoding='utf-8') as f:
    json.dump(blocks, f)
  proc = forkserver.run([sys.executable, '-m', 'tests.project.readme_checks', 'blocks.json'],
                        cwd=tmp_path, env=fixtures.cpu_env(1), text=True, timeout=600)
  shown = proc.stdout[-3000:] + proc.stderr[-5000:]
  assert proc.returncode == 0, shown
  ran = [line for line in proc.stdout.splitlines() if line.startswith('README.md:')]
  assert ran == [f'README.md:{b["line"]}: ran'
                 + (' and checked' if b['heading'] in readme_checks.CHECKS else '')
                 for b in blocks], shown


# ------------------------------------------------------------------------------------------------
# Links

LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')
DOCUMENTS = ('README.md', 'docs')  # README.md and every .md file of docs/


def _outside_code(text: str) -> str:
  """`text` without its fenced blocks and inline code spans."""
  text = re.sub(r'^```.*?^```', '', text, flags=re.S | re.M)
  return re.sub(r'`[^`\n]*`', '', text)


def slug(heading: str) -> str:
  """GitHub's anchor of a heading's text: lower case, punctuation and symbols dropped (letters,
  digits, '-', '_' kept), spaces to '-'."""
  kept = ''.join(c for c in heading.strip().lower()
                 if c in ' -_' or unicodedata.category(c)[0] in 'LN')
  return kept.replace(' ', '-')


def anchors(path: str) -> set:
  """The #anchors of a markdown file's headings (a repeated heading gets -1, -2, ...)."""
  with open(path, encoding='utf-8') as f:
    text = re.sub(r'^```.*?^```', '', f.read(), flags=re.S | re.M)
  seen, found = {}, set()
  for line in text.splitlines():
    match = re.match(r'#{1,6} (.+)', line)
    if match:
      base = slug(match.group(1))
      found.add(base if base not in seen else f'{base}-{seen[base]}')
      seen[base] = seen.get(base, 0) + 1
  return found


def documents(root: str) -> list[str]:
  paths = [os.path.join(root, 'README.md')]
  docs = os.path.join(root, 'docs')
  paths += sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith('.md'))
  return paths


def broken_links(root: str) -> list[str]:
  """'file: target (why)' of every relative link of README.md and docs/*.md that does not
  resolve: a missing file or folder, or an #anchor that is no heading of its markdown file."""
  broken = []
  for path in documents(root):
    with open(path, encoding='utf-8') as f:
      text = _outside_code(f.read())
    for target in LINK.findall(text):
      if re.match(r'[a-z][a-z0-9+.-]*:', target):  # https:, mailto:, ...
        continue
      file_part, _, anchor = target.partition('#')
      resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part \
          else path
      where = f'{os.path.relpath(path, root)}: {target}'
      if not os.path.exists(resolved):
        broken.append(f'{where} (no such file)')
      elif anchor and resolved.endswith('.md') and anchor not in anchors(resolved):
        broken.append(f'{where} (no heading with that anchor)')
  return broken


def test_every_relative_link_of_the_readme_and_docs_resolves():
  assert broken_links(ROOT) == []


def test_the_link_check_finds_missing_files_and_anchors(tmp_path):
  (tmp_path / 'docs').mkdir()
  (tmp_path / 'README.md').write_text(
      "# Top\n## DAPE's claim (`make demo-dape`)\n[a](docs/a.md#part-two) [b](#dapes-claim-make-"
      "demo-dape) [c](https://x.org/y) ![d](docs/missing.png) [e](#nowhere)\n"
      "```\n[f](in/a/code/block.md)\n```\n`[g](inline/code.md)`\n")
  (tmp_path / 'docs' / 'a.md').write_text('# A\n## Part two\n[up](../README.md#top) '
                                          '[self](#part-three) [dir](../docs)\n')
  assert broken_links(str(tmp_path)) == [
      'README.md: docs/missing.png (no such file)',
      'README.md: #nowhere (no heading with that anchor)',
      'docs/a.md: #part-three (no heading with that anchor)']
  assert slug('Buckets (gs://)') == 'buckets-gs'
  assert slug('Length extrapolation: 1× to 16×') == 'length-extrapolation-1-to-16'
