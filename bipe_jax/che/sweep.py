"""A grid of CHE cells (tasks x encodings x seeds), written incrementally and resumable.

Layout of `output_dir`:
  cells/TASK__ENCODING__seedS.json   one cell (cell.run_cell), written when it finishes;
  results.json                       every finished cell + the table, rewritten after each cell;
  table.md                           the table (score x 100: mean +- std over seeds (n));
  TASK.png                           accuracy against length, per encoding (mean over seeds).
A rerun skips the finished cells; a finished cell whose budget, scoring plan or segmentation
differs from the run's is refused (one line naming the file), so one grid never mixes budgets.
Order: seed-major (every task x encoding of seed 0 first), so an interrupted grid has whole
columns to compare.

Several processes (e.g. on one GPU) split a grid by (task, encoding) pair, every seed of a pair
in a row (so the compiled programs of one pair are reused), and write cells only:
- `queue_dir=DIR`: each process takes the next pair that no process has claimed yet (a claim is
  the directory DIR/TASK__ENCODING, made atomically); cells that differ tenfold in cost keep
  every process busy. DIR must be shared by the processes (one machine, or one file system).
- `shard=(i, n)`: a fixed split, the pairs whose index in the grid is i mod n.
A last run without either, once every cell exists, writes results.json, table.md and the PNGs
(and trains any cell still missing, e.g. of a process that died holding a claim).
`--assemble_only` writes them from the cells finished so far, training nothing.
"""

import dataclasses
import os
import time
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from bipe_jax import storage
from bipe_jax.che import cell as cell_lib
from bipe_jax.che import training


def cell_path(output_dir: str, task: str, encoding: str, seed: int) -> str:
  return storage.join(output_dir, 'cells', f'{task}__{encoding}__seed{seed}.json')


def _check_same_setup(path: str, done: dict, budget, plan, segmentation: str,
                      randomized_positions: int = 0, architecture: str = 'project') -> None:
  want = dict(budget=dataclasses.asdict(budget), eval=dataclasses.asdict(plan),
              segmentation=cell_lib.segmentation_of(done['encoding'], segmentation),
              randomized_positions=randomized_positions, architecture=architecture)
  got = {k: done.get(k) for k in want}
  got['randomized_positions'] = done.get('randomized_positions', 0)  # cells before the option
  got['architecture'] = done.get('architecture', 'project')  # cells before the option
  if got != want:
    raise ValueError(f'{path}: this finished cell has {got}, but the run asks for {want}; '
                     f'use another output_dir or the same settings.')


def _claim(queue_dir: str, task: str, encoding: str) -> bool:
  """True for the one process whose mkdir of the pair's claim succeeds."""
  os.makedirs(queue_dir, exist_ok=True)
  try:
    os.mkdir(os.path.join(queue_dir, f'{task}__{encoding}'))
  except FileExistsError:
    return False
  return True


def table(cells: Sequence[dict], tasks: Sequence[str], encodings: Sequence[str]) -> str:
  """Markdown: one row per task, one column per encoding; score x 100 as mean +- std (seeds)."""
  lines = ['| task | level | ' + ' | '.join(encodings) + ' |',
           '|---|---|' + '---|' * len(encodings)]
  for t in tasks:
    row = [c for c in cells if c['task'] == t]
    level = row[0]['level'] if row else ''
    entries = []
    for e in encodings:
      scores = [100 * c['score'] for c in row if c['encoding'] == e]
      entries.append('-' if not scores else
                     f'{np.mean(scores):.1f} ± {np.std(scores):.1f} ({len(scores)})')
    lines.append(f'| {t} | {level} | ' + ' | '.join(entries) + ' |')
  return '\n'.join(lines)


def mean_curves(cells: Sequence[dict], task: str) -> dict:
  """{encoding: {length: mean accuracy over the seeds}} of one task."""
  out = {}
  for e in sorted({c['encoding'] for c in cells if c['task'] == task}):
    accs = [c['accuracy'] for c in cells if c['task'] == task and c['encoding'] == e]
    out[e] = {k: float(np.mean([a[k] for a in accs])) for k in accs[0]}
  return out


def run_grid(tasks: Sequence[str], encodings: Sequence[str], seeds: Sequence[int],
             budget: training.Budget, plan: cell_lib.EvalPlan, output_dir: str, *,
             segmentation: str = 'task', command: str = '',
             say: Optional[Callable[[str], None]] = None,
             shard: Optional[Tuple[int, int]] = None, queue_dir: Optional[str] = None,
             train_missing: bool = True, randomized_positions: int = 0,
             architecture: str = 'project') -> dict:
  """Runs the missing cells; returns the summary also written to results.json (with a shard or
  a queue: only its cells' table, nothing written but the cells). `train_missing=False`: the
  summary of the finished cells only (a grid still running elsewhere), nothing trained."""
  say = say or print
  if shard is not None and queue_dir is not None:
    raise ValueError('--shard and --queue_dir split a grid two ways; give one of them.')
  if queue_dir is not None and not storage.is_local(queue_dir):
    raise ValueError(f'--queue_dir={queue_dir}: a claim is a directory made atomically, which '
                     'an object store has not; give a local or shared file system folder')
  split = shard is not None or queue_dir is not None
  cells, missing = [], 0
  total = len(tasks) * len(encodings) * len(seeds)
  order = [(seed, t, e) for seed in seeds for t in tasks for e in encodings]
  if split:
    i, n = shard or (0, 1)
    pairs = [(t, e) for t in tasks for e in encodings][i::n]
    order = [(seed, t, e) for t, e in pairs for seed in seeds]
    total = len(order)
  mine = {}  # (task, encoding) -> whether this process holds its claim (queue_dir only)
  for seed, t, e in order:
    path = cell_path(output_dir, t, e, seed)
    done = storage.read_json(path)
    if done is not None:
      _check_same_setup(path, done, budget, plan, segmentation, randomized_positions,
                        architecture)
      cells.append(done)
      continue
    if not train_missing:
      missing += 1
      continue
    if queue_dir is not None:
      if (t, e) not in mine:
        mine[t, e] = _claim(queue_dir, t, e)
      if not mine[t, e]:
        continue  # another process trains this pair
    say(f'[{len(cells) + 1}/{total}] {t} {e} seed {seed}')
    start = time.perf_counter()
    result = cell_lib.run_cell(t, e, seed, budget, plan, segmentation=segmentation,
                               randomized_positions=randomized_positions,
                               architecture=architecture, progress=say)
    result['command'] = command
    cell_lib.write_json(path, result)
    cells.append(result)
    say(f'  score {100 * result["score"]:.1f} (lengths 41..500), in-distribution '
        f'{100 * result["in_distribution"]:.1f} ({time.perf_counter() - start:.0f}s)')
    if not split:
      _write_summary(output_dir, cells, tasks, encodings, budget, plan, segmentation, command)
  if missing:
    say(f'{missing} of {total} cells not finished yet (not trained: assembling only)')
  if split:
    return dict(table=table(cells, tasks, encodings),
                scored_lengths=cells[0]['scored_lengths'] if cells else '')
  return _write_summary(output_dir, cells, tasks, encodings, budget, plan, segmentation,
                        command)


def _write_summary(output_dir, cells, tasks, encodings, budget, plan, segmentation, command):
  text = table(cells, tasks, encodings)
  summary = dict(command=command, budget=dataclasses.asdict(budget),
                 eval=dataclasses.asdict(plan), bipe_segmentation=segmentation,
                 scored_lengths=cells[0]['scored_lengths'] if cells else '',
                 table=text, cells=cells)
  cell_lib.write_json(storage.join(output_dir, 'results.json'), summary)
  storage.write_text_atomic(storage.join(output_dir, 'table.md'), text + '\n')
  for t in tasks:
    curves = mean_curves(cells, t)
    if curves:
      cell_lib.plot_accuracy(storage.join(output_dir, f'{t}.png'), curves,
                             f'{t}: accuracy against length (mean over seeds)')
  return summary
