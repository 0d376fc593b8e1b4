"""Accuracy against model depth and number of operators on the arithmetic task (BiPE paper).

For every (encoding, layers, operators N) of a `SweepPlan`, `sweep` trains the task's config
(configs/arithmetic_tiny.py: problems of 1..N operators) in chunks of `chunk_steps` at a
constant learning rate, measuring the greedy exact-match accuracy at N operators on held-out
problems after every chunk, until it converges (`stop_reason`: the accuracy reached
`target_accuracy`, or the best accuracy of the last `patience` checks is not `min_delta` above
the best before them, or `max_steps`). Then it scores every count 1..N + `extra_ops` on
`final_per_length` problems. Each run's learning curve is `<root>/<run>/convergence.json`, so a
stopped sweep resumes where it was, and rerunning with a higher `max_steps` continues the runs
stopped at the old cap; the whole result is `<root>/arithmetic_sweep.json` and two
markdown tables (accuracy at N by depth, accuracy by operator count at the largest depth).
A run preempted mid-chunk (SIGTERM: the trainer saves a checkpoint and returns) stops the sweep
with `SweepPreempted` before its check is taken, so no accuracy is recorded for steps that were
not trained; the same command resumes from that checkpoint.

    python eval/arithmetic_sweep.py --root=runs/arith_sweep
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

from bipe_jax import storage
from bipe_jax.tasks import arithmetic
from bipe_jax.tasks import modular_expressions as expressions

CURVE_FILE = 'convergence.json'
RESULTS_FILE = 'arithmetic_sweep.json'


@dataclasses.dataclass(frozen=True)
class SweepPlan:
  encodings: tuple[str, ...] = ('rope', 'bipe_rope')
  layers: tuple[int, ...] = (1, 2, 3)
  max_ops: tuple[int, ...] = (4, 5, 6)  # Feng et al.'s operator counts
  chunk_steps: int = 500
  max_steps: int = 20000
  patience: int = 4
  min_delta: float = 0.01
  target_accuracy: float = 0.995
  per_length: int = 200  # held-out problems of N operators per check
  final_per_length: int = 500
  extra_ops: int = 2  # final scoring also at N+1 .. N+extra_ops (longer than any training one)

  def __post_init__(self):
    for name in ('chunk_steps', 'max_steps', 'patience', 'per_length', 'final_per_length'):
      if int(getattr(self, name)) < 1:
        raise ValueError(f'{name}={getattr(self, name)}: must be >= 1')
    if self.extra_ops < 1:
      raise ValueError(f'extra_ops={self.extra_ops}: must be >= 1 (longer evaluation problems)')
    if not 0.0 < self.target_accuracy <= 1.0:
      raise ValueError(f'target_accuracy={self.target_accuracy}: must be in (0, 1]')
    for name in ('encodings', 'layers', 'max_ops'):
      if not getattr(self, name):
        raise ValueError(f'{name}: give at least one value')
    for name in ('layers', 'max_ops'):
      if min(getattr(self, name)) < 1:
        raise ValueError(f'{name}={getattr(self, name)}: every value must be >= 1')

  def runs(self) -> list[tuple[str, int, int]]:
    """(encoding, layers, N) for every point of the grid, cheapest first."""
    return [(e, l, n) for n in self.max_ops for l in self.layers for e in self.encodings]


def run_name(encoding: str, layers: int, max_ops: int) -> str:
  return f'{encoding}_L{layers}_N{max_ops}'


def run_config(base_config, encoding: str, layers: int, max_ops: int, plan: SweepPlan):
  """A copy of the task config for one grid point: problems of 1..max_ops operators, a constant
  learning rate after warm-up (training continues chunk by chunk), a checkpoint per chunk, and
  seq_len raised (to a multiple of 64) when the longest problem would not fit."""
  config = base_config.copy_and_resolve_references()
  config.model.position_encoding = encoding
  config.model.num_layers = int(layers)
  d = config.data
  d.arithmetic_train_max_ops = int(max_ops)
  d.arithmetic_eval_max_ops = int(max_ops) + plan.extra_ops
  longest = expressions.max_chain_tokens(int(max_ops)) + 2  # <bos>, <eos>
  if d.seq_len < longest:
    d.seq_len = -(-longest // 64) * 64
  config.train.schedule = 'constant'
  config.checkpoint.every_steps = plan.chunk_steps
  config.checkpoint.keep = 2
  return config


def stop_reason(accuracies: Sequence[float], steps: int, plan: SweepPlan) -> str | None:
  """'target' | 'plateau' | 'max_steps' when training should stop after these checks, else
  None. Plateau: the best of the last `patience` checks is not `min_delta` above the best of
  the checks before them."""
  if accuracies and accuracies[-1] >= plan.target_accuracy:
    return 'target'
  if len(accuracies) > plan.patience:
    before = max(accuracies[:-plan.patience])
    if max(accuracies[-plan.patience:]) < before + plan.min_delta:
      return 'plateau'
  if steps >= plan.max_steps:
    return 'max_steps'
  return None


TrainFn = Callable[..., object]  # train_fn(config, workdir): trains to config.train.steps
#   and returns an object whose `preempted` / `step` say whether it stopped early (TrainResult)
AccuracyFn = Callable[..., list]  # accuracy_fn(workdir, problems) -> [LengthAccuracy]


class SweepPreempted(RuntimeError):
  """Training was preempted mid-chunk: the checkpoint is saved, the chunk's check not taken."""


def train_to_convergence(config, workdir: str, plan: SweepPlan, *, train_fn: TrainFn,
                         accuracy_fn: AccuracyFn, log: Callable[[str], None] = print) -> dict:
  """Trains `config` in `workdir` chunk by chunk until `stop_reason`; returns (and keeps in
  `<workdir>/convergence.json`) {'steps': [...], 'accuracy': [...], 'stopped': reason}.
  A curve already in the workdir is continued, or returned when it has stopped; one stopped
  by an earlier, lower `max_steps` continues under this plan's cap, unless its checks already
  meet this plan's target or plateau rule."""
  path = storage.join(workdir, CURVE_FILE)
  curve = storage.read_json(path) or {'steps': [], 'accuracy': [], 'stopped': None}
  if curve['stopped'] == 'max_steps' and curve['steps'][-1] < plan.max_steps:
    curve['stopped'] = stop_reason(curve['accuracy'], curve['steps'][-1], plan)
    storage.write_json(path, curve)  # the file says why, too
    if not curve['stopped']:
      log(f'{os.path.basename(workdir)}: stopped at the cap of step {curve["steps"][-1]}; '
          f'continuing to max_steps={plan.max_steps}')
  settings = arithmetic.settings_from_config(config.data)
  n = settings.train_max_ops
  problems = arithmetic.problems_by_length(settings, 'test', plan.per_length, num_ops=[n])
  while not curve['stopped']:
    steps = (curve['steps'][-1] if curve['steps'] else 0) + plan.chunk_steps
    config.train.steps = steps
    trained = train_fn(config, workdir)
    if getattr(trained, 'preempted', False):
      raise SweepPreempted(
          f'{os.path.basename(workdir)}: preempted at step {getattr(trained, "step", "?")} of the '
          f'chunk to step {steps}; its checkpoint is saved and no check was recorded for it; '
          'rerun the same command to resume')
    acc = accuracy_fn(workdir, problems)[0].accuracy
    curve['steps'].append(steps)
    curve['accuracy'].append(acc)
    curve['stopped'] = stop_reason(curve['accuracy'], steps, plan)
    storage.write_json(path, curve)
    log(f'{os.path.basename(workdir)}: step {steps}, accuracy at {n} operators {acc:.3f}'
        + (f' -> stop ({curve["stopped"]})' if curve['stopped'] else ''))
  return curve


def sweep(plan: SweepPlan, base_config, root: str, *, train_fn: TrainFn, accuracy_fn: AccuracyFn,
          log: Callable[[str], None] = print) -> dict:
  """Runs the whole grid (resuming finished and unfinished runs) and writes
  `<root>/arithmetic_sweep.json`: per run its curve and its accuracy by operator count."""
  plan_doc = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(plan).items()}
  doc = {'plan': plan_doc, 'runs': []}
  for encoding, layers, n in plan.runs():
    name = run_name(encoding, layers, n)
    workdir = storage.join(root, name)
    config = run_config(base_config, encoding, layers, n, plan)
    curve = train_to_convergence(config, workdir, plan, train_fn=train_fn,
                                 accuracy_fn=accuracy_fn, log=log)
    settings = arithmetic.settings_from_config(config.data)
    problems = arithmetic.problems_by_length(settings, 'test', plan.final_per_length)
    problems.update(arithmetic.problems_by_length(settings, 'eval', plan.final_per_length))
    results = accuracy_fn(workdir, problems)
    doc['runs'].append({'name': name, 'encoding': encoding, 'layers': layers, 'max_ops': n,
                        'steps': curve['steps'][-1], 'stopped': curve['stopped'],
                        'curve': curve, 'results': [r.to_dict() for r in results]})
    storage.write_json(storage.join(root, RESULTS_FILE), doc)
    log(f'{name}: done at step {curve["steps"][-1]} ({curve["stopped"]})')
  return doc


def format_tables(doc: dict) -> str:
  """Two markdown tables from a sweep document: (1) accuracy at N operators by depth, one row
  per (N, layers), a column per encoding (with the steps trained); (2) accuracy by operator
  count for the largest depth, a column per (encoding, N)."""
  runs = doc['runs']
  encodings = list(dict.fromkeys(r['encoding'] for r in runs))

  def at(r, n):
    return next((x['accuracy'] for x in r['results'] if x['num_ops'] == n), float('nan'))

  lines = ['| operators N | layers | ' + ' | '.join(encodings) + ' |',
           '|---:|---:|' + '---:|' * len(encodings)]
  for n, layers in dict.fromkeys((r['max_ops'], r['layers']) for r in runs):
    cells = []
    for e in encodings:
      r = next((r for r in runs if (r['encoding'], r['layers'], r['max_ops']) == (e, layers, n)),
               None)
      cells.append(f'{at(r, n):.3f} ({r["steps"]} steps)' if r else '-')
    lines.append(f'| {n} | {layers} | ' + ' | '.join(cells) + ' |')
  deepest = max(r['layers'] for r in runs)
  top = [r for r in runs if r['layers'] == deepest]
  counts = sorted({x['num_ops'] for r in top for x in r['results']})
  labels = [f'{r["encoding"]} N={r["max_ops"]}' for r in top]
  lines += ['', f'accuracy by operator count, {deepest} layers (trained on 1..N):', '',
            '| operators | ' + ' | '.join(labels) + ' |', '|---:|' + '---:|' * len(top)]
  for c in counts:
    cells = [f'{at(r, c):.3f}' if any(x['num_ops'] == c for x in r['results']) else '-'
             for r in top]
    lines.append(f'| {c} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def workdir_accuracy(workdir: str, problems: dict, *, batch_size: int = 100) -> list:
  """Greedy accuracy of a training workdir's latest checkpoint on `problems` (by count)."""
  from bipe_jax.evaluation import arithmetic_accuracy as acc  # pylint: disable=g-import-not-at-top
  from bipe_jax.runs import restore as runs_lib  # pylint: disable=g-import-not-at-top
  run = runs_lib.load_run(workdir)
  with run.context():
    return acc.accuracy_by_length(run.apply_fn(), run.params, problems, batch_size=batch_size)


def main(plan: SweepPlan, base_config, root: str) -> int:
  """What eval/arithmetic_sweep.py runs: the sweep with the project's trainer, the tables on
  stdout; a bad config or plan is one line on stderr and exit code 2; a preemption (SIGTERM) one
  line on stderr and exit code 75 (bipe_jax.cli.EXIT_PREEMPTED), as train/main.py (the
  checkpoint is saved: run the same command again)."""
  import sys  # pylint: disable=g-import-not-at-top
  from bipe_jax import run_config  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import trainer  # pylint: disable=g-import-not-at-top
  from bipe_jax.runs import workdir_lock  # pylint: disable=g-import-not-at-top
  try:
    doc = sweep(plan, base_config, root, train_fn=trainer.train, accuracy_fn=workdir_accuracy,
                log=lambda s: print(s, flush=True))
  except (ValueError, run_config.ConfigError, workdir_lock.WorkdirInUseError) as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  except SweepPreempted as e:
    from bipe_jax.cli import EXIT_PREEMPTED  # pylint: disable=g-import-not-at-top
    print(f'stopped: {e}', file=sys.stderr, flush=True)
    return EXIT_PREEMPTED
  print('\nexact-match accuracy of the final answer at N operators (held-out problems):')
  print(format_tables(doc), flush=True)
  print(f'wrote {storage.join(root, RESULTS_FILE)}')
  return 0
