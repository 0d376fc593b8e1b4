"""docs/results.md's table of the randomized CHE grid holds exactly the committed cells
(eval/results/che_grid_randomized/cells/), with their scores, and every cell was trained on the
budget fixed before the grid started (1,000 steps x 32, learning rate 1e-3, L = 2048, the
project's block): a cell added without its row, a row without its cell, or a number copied
wrong fails here."""

import glob
import json
import os
import re

from tests import fixtures

CELLS = os.path.join(fixtures.ROOT, 'eval', 'results', 'che_grid_randomized', 'cells')
RESULTS = os.path.join(fixtures.ROOT, 'docs', 'results.md')
BUDGET = {'batch_size': 32, 'learning_rate': 0.001, 'max_length': 40, 'steps': 1000}


def _table_rows() -> dict:
  """{(task, encoding): (score, in-distribution)} of the randomized grid's section (x 100)."""
  with open(RESULTS, encoding='utf-8') as f:
    text = f.read()
  section = text[text.index('### The randomized grid'):]
  section = section[:section.index('\n## ')]
  rows = {}
  for line in section.splitlines():
    m = re.match(r'\| ([a-z ]+) \| ([a-z_]+) \| ([\d.]+) \| ([\d.]+) \|', line)
    if m:
      rows[m.group(1).replace(' ', '_'), m.group(2)] = (float(m.group(3)), float(m.group(4)))
  return rows


def test_the_table_holds_every_committed_cell_and_only_those():
  cells = {}
  for path in glob.glob(os.path.join(CELLS, '*.json')):
    with open(path, encoding='utf-8') as f:
      cell = json.load(f)
    assert cell['seed'] == 0, path  # the table is seed 0's (more seeds: a mean +- std table)
    assert cell['budget'] == BUDGET and cell['randomized_positions'] == 2048, path
    assert cell['architecture'] == 'project', path
    cells[cell['task'], cell['encoding']] = (round(100 * cell['score'], 1),
                                             round(100 * cell['in_distribution'], 1))
  rows = _table_rows()
  assert len(cells) >= 15
  assert rows == cells
  count = re.search(r'\*\*Status: (\d+) of 72 cells\*\*', open(RESULTS, encoding='utf-8').read())
  assert count and int(count.group(1)) == len(cells), count
