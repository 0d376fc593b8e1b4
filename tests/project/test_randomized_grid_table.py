"""docs/results.md's table of the randomized CHE grid holds exactly the committed cells
(eval/results/che_grid_randomized/cells/), with their scores as mean ± std over the seeds
finished (n), beside the first grid's three seeds of the same pair (eval/results/che_grid/cells/),
and every cell was trained on the budget fixed before the grid started (1,000 steps x 32,
learning rate 1e-3, L = 2048, the project's block): a cell added without its row, a row without
its cell, or a number copied wrong fails here. `expected_rows` is what the table is written from.
The README's shorter table (out of distribution only, randomized beside the first grid) is
checked against the same cells.
"""

import collections
import glob
import json
import os
import re

import numpy as np

from tests import fixtures

RESULTS_DIR = os.path.join(fixtures.ROOT, 'eval', 'results')
RANDOMIZED_CELLS = os.path.join(RESULTS_DIR, 'che_grid_randomized', 'cells')
FIRST_GRID_CELLS = os.path.join(RESULTS_DIR, 'che_grid', 'cells')
RESULTS = os.path.join(fixtures.ROOT, 'docs', 'results.md')
README = os.path.join(fixtures.ROOT, 'README.md')
TASKS = ('reverse_string', 'duplicate_string', 'missing_duplicate_string')  # the README's columns
BUDGET = {'batch_size': 32, 'learning_rate': 0.001, 'max_length': 40, 'steps': 1000}
SEEDS = (0, 1, 2)


def _cells(folder: str) -> dict:
  """{(task, encoding): [cell, ...]} of the cells in `folder`."""
  out = collections.defaultdict(list)
  for path in sorted(glob.glob(os.path.join(folder, '*.json'))):
    with open(path, encoding='utf-8') as f:
      cell = json.load(f)
    out[cell['task'], cell['encoding']].append(cell)
  return out


def _mean_std(cells: list, key: str) -> str:
  """'mean ± std (n)' of 100 * cell[key] over the seeds (std over the seeds, as the grid's own
  table.md: numpy's population std)."""
  values = [100 * c[key] for c in cells]
  return f'{np.mean(values):.1f} ± {np.std(values):.1f} ({len(values)})'


def expected_rows() -> dict:
  """{(task, encoding): (randomized 41..500, randomized 1..40, first grid 41..500, first grid
  1..40)}, each 'mean ± std (n)'."""
  first = _cells(FIRST_GRID_CELLS)
  return {pair: (_mean_std(cells, 'score'), _mean_std(cells, 'in_distribution'),
                 _mean_std(first[pair], 'score'), _mean_std(first[pair], 'in_distribution'))
          for pair, cells in _cells(RANDOMIZED_CELLS).items()}


def _section(path: str, heading: str) -> str:
  """The text of `path` from `heading` to the next second-level heading."""
  with open(path, encoding='utf-8') as f:
    text = f.read()
  section = text[text.index(heading):]
  return section[:section.index('\n## ')]


def _table_rows() -> dict:
  """The same, read from the randomized grid's section of docs/results.md."""
  section = _section(RESULTS, '### The randomized grid')
  entry = r' ([\d.]+ ± [\d.]+ \(\d\)) \|'
  rows = {}
  for line in section.splitlines():
    m = re.match(r'\| ([a-z ]+) \| ([a-z_]+) \|' + entry * 4, line)
    if m:
      rows[m.group(1).replace(' ', '_'), m.group(2)] = m.groups()[2:]
  return rows


def test_every_cell_has_the_fixed_budget_and_one_of_the_three_seeds():
  cells = [c for pair in _cells(RANDOMIZED_CELLS).values() for c in pair]
  assert len(cells) >= 24
  for cell in cells:
    name = f'{cell["task"]} {cell["encoding"]} seed {cell["seed"]}'
    assert cell['seed'] in SEEDS, name
    assert cell['budget'] == BUDGET and cell['randomized_positions'] == 2048, name
    assert cell['architecture'] == 'project', name
  for pair, seeds in _cells(RANDOMIZED_CELLS).items():
    assert len({c['seed'] for c in seeds}) == len(seeds), pair


def test_the_table_holds_every_committed_cell_and_only_those():
  rows = _table_rows()
  assert rows == expected_rows()
  cells = sum(len(v) for v in _cells(RANDOMIZED_CELLS).values())
  with open(RESULTS, encoding='utf-8') as f:
    count = re.search(r'\*\*Status: (\d+) of 72 cells\*\*', f.read())
  assert count and int(count.group(1)) == cells, count


def _readme_rows() -> dict:
  """{(task, encoding): (randomized 41..500, first grid 41..500)}, each 'mean ± std', read from
  the README's table (one row per encoding, one column per task: 'randomized (first grid)')."""
  section = _section(README, '### Chomsky-hierarchy tasks with randomized positions')
  entry = r' ([\d.]+ ± [\d.]+) \(([\d.]+ ± [\d.]+)\) \|'
  rows = {}
  for line in section.splitlines():
    m = re.match(r'\| ([a-z_]+) \|' + entry * len(TASKS) + '$', line)
    if m:
      for i, task in enumerate(TASKS):
        rows[task, m.group(1)] = m.group(2 + 2 * i, 3 + 2 * i)
  return rows


def test_the_readme_table_gives_every_pair_out_of_distribution_beside_the_first_grid():
  drop_n = lambda entry: entry.rsplit(' (', 1)[0]
  want = {pair: (drop_n(v[0]), drop_n(v[2])) for pair, v in expected_rows().items()}
  assert _readme_rows() == want
