"""One cell: train an encoder on one (task, encoding, seed) and score it at every requested
length; the result is a JSON-able dict (and, with `write`, a JSON file and a PNG of accuracy
against length)."""

import dataclasses
import time
from typing import Callable, Optional

import jax

from bipe_jax import schemes
from bipe_jax import storage
from bipe_jax.che import batches as batches_lib
from bipe_jax.che import model as che_model
from bipe_jax.che import scoring
from bipe_jax.che import segments
from bipe_jax.che import training
from bipe_jax.tasks import che as tasks


@dataclasses.dataclass(frozen=True)
class EvalPlan:
  lengths: str = '1-40:3,41-500:20,500'  # scoring.parse_lengths
  samples: int = 32  # rows per length
  bucket: int = 64


def segmentation_of(encoding: str, segmentation: str) -> str:
  """What the result reports: the segmentation for bipe_* encodings, 'n/a' otherwise."""
  return segmentation if schemes.get_scheme(encoding).bilevel else 'n/a'


def check_randomized_positions(big_l: int, task, lengths, budget: training.Budget,
                               plan: EvalPlan) -> None:
  """ValueError (one line) unless L is 0 (off) or holds every padded row: a row of T tokens
  takes T distinct positions of 0..L-1."""
  if big_l < 0:
    raise ValueError(f'--randomized_positions={big_l} must be >= 0 (0 = off).')
  if not big_l:
    return
  bucket = plan.bucket
  longest = max(-(-batches_lib.row_length(task, n) // bucket) * bucket
                for n in (*lengths, budget.max_length))
  if big_l < longest:
    raise ValueError(f'--randomized_positions={big_l} must be at least {longest}: the longest '
                     f'padded row of {task.name} at the scored lengths (bucket {bucket}) takes '
                     f'that many distinct positions; score shorter lengths or raise L.')


def run_cell(task_name: str, encoding: str, seed: int, budget: training.Budget, plan: EvalPlan,
             *, segmentation: str = 'task', model_overrides: Optional[dict] = None,
             randomized_positions: int = 0, architecture: str = 'project',
             progress: Optional[Callable[[str], None]] = None) -> dict:
  """`randomized_positions` = L > 0: positions drawn as ordered random subsets of 0..L-1, in
  training and in scoring (bipe_jax/encodings/randomized.py); every padded row must fit L."""
  say = progress or (lambda _: None)
  task = tasks.get_task(task_name)
  segments.parse(segmentation)
  lengths = scoring.parse_lengths(plan.lengths)
  max_tokens = max(batches_lib.row_length(task, n) for n in (*lengths, budget.max_length))
  check_randomized_positions(randomized_positions, task, lengths, budget, plan)
  cfg = che_model.che_model_config(task, encoding, max_tokens=max_tokens + plan.bucket,
                                   train_length=budget.max_length,
                                   randomized_positions=randomized_positions,
                                   **(model_overrides or {}))
  module = che_model.build_module(cfg, task, architecture)  # 'project' | 'peer' (che/model.py)
  params = che_model.init_params(module, seed)
  start = time.perf_counter()
  params, losses = training.train(
      task, module, params, budget, seed=seed, segmentation=segmentation,
      progress=lambda s, l, t: say(f'  step {s}/{budget.steps} loss {l:.4f} ({t:.0f}s)'),
      log_every=max(1, budget.steps // 5), bucket=training.TRAIN_BUCKET)
  train_s = time.perf_counter() - start
  start = time.perf_counter()
  accuracy = scoring.per_length_accuracy(task, module, params, lengths, samples=plan.samples,
                                         seed=10_000 + seed, segmentation=segmentation,
                                         bucket=plan.bucket)
  eval_s = time.perf_counter() - start
  return dict(
      task=task_name, level=task.level, encoding=encoding, seed=seed,
      segmentation=segmentation_of(encoding, segmentation),
      score=scoring.score(accuracy), in_distribution=scoring.mean_over(accuracy, 1, budget.max_length),
      scored_lengths=scoring.describe(lengths), accuracy={str(k): v for k, v in accuracy.items()},
      budget=dataclasses.asdict(budget), eval=dataclasses.asdict(plan),
      model=dict(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
                 num_heads=cfg.num_heads, ffn_size=cfg.ffn_size, causal=cfg.causal),
      randomized_positions=cfg.randomized_positions, architecture=architecture,
      train_bucket=training.TRAIN_BUCKET,
      final_loss=losses[-1], train_seconds=round(train_s, 1), eval_seconds=round(eval_s, 1),
      device=jax.devices()[0].device_kind, jax_version=jax.__version__)


def write_json(path: str, payload) -> None:
  """Writes `payload` to `path` (local or gs://) whole or not at all (storage.write_json): an
  interrupted run leaves no half file."""
  storage.write_json(path, payload, indent=1, sort_keys=True)


def plot_accuracy(path: str, curves: dict, title: str,
                  train_max: int = che_model.TRAIN_MAX_LENGTH) -> None:
  """PNG of accuracy against length; `curves` {label: {length: accuracy}}."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7, 4))
  for label, acc in sorted(curves.items()):
    xs = sorted(int(k) for k in acc)
    ax.plot(xs, [acc[str(x)] if str(x) in acc else acc[x] for x in xs], marker='.', label=label)
  ax.axvline(train_max, color='grey', linestyle=':', label=f'trained up to {train_max}')
  ax.set_xlabel('input length')
  ax.set_ylabel('accuracy')
  ax.set_ylim(0, 1.02)
  ax.set_title(title)
  ax.legend(fontsize=7)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)
