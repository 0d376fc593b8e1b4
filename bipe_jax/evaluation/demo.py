"""`make demo`: train the tiny preset with several encodings at a short length, evaluate each at
1x..16x that length, print one table side by side, write JSON, Markdown and a PNG.

The budget (steps, length, batch, learning rate, warm-up) is one `DemoPlan` for every encoding:
it was chosen once, from how far the RoPE baseline gets in the time a demo may take on the
2-core machine, before any other encoding was trained with it, and it is printed and recorded
with the results. Nothing is tuned per encoding.

Each training run is a subprocess of train/main.py (exactly what a user would type), in
`<output_dir>/runs/<encoding>`; running the demo again resumes or reuses finished runs (their
checkpoints are the final ones), so only missing work is done. Evaluation restores each run
(bipe_jax.runs.restore) and scores the same validation tokens at every length with
blockwise attention.

A SIGTERM to the demo (a scheduler ending the job) is passed on to its training subprocesses,
which save a checkpoint and exit; a run that ends before its last step stops the demo with an
error that says so (nothing half-trained is evaluated), and running the demo again resumes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

from bipe_jax import cli
from bipe_jax import storage
from bipe_jax.evaluation import segment_runs
from bipe_jax.runs import run_logging
from bipe_jax.kernels import cpu_devices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_SCRIPT = os.path.join(ROOT, 'train', 'main.py')

# For the up-front time estimate only, from measurements on the project's 2-core CPU machine,
# tiny preset at seq_len 64, batch 32: a step takes ~0.115 s wall on two single-threaded CPU
# devices (`train/main.py --cpu_devices=2`, 18k tokens/s at load < 2, 2026-11-23; one device
# on both cores: ~0.2 s),
# or ~0.36 s in each of two single-threaded runs side by side (--parallel=2); a training
# subprocess spends ~12 s in imports, compilation and checkpointing.
SECONDS_PER_STEP = 0.115
SECONDS_PER_STEP_SIDE_BY_SIDE = 0.36

SECONDS_TRAIN_STARTUP = 12.0
SECONDS_PREPARE = 30.0  # building the embedded corpus + tokenizer when missing
EVAL_TOKENS_PER_SECOND = 25_000.0
SECONDS_EVAL_STARTUP = 5.0  # restore + one compilation per length


# `make demo` trains the pair the paper's main claim is about; `make demo-all` adds the ALiBi
# pair (the same budget, into the same output folder: the first two runs are reused). Four runs
# take ~13 min on this 2-core CPU in its fast state but ~27 min in its slow one (benchmarks/
# core_parallelism.py), over the 15 min a demo may take; two fit in both.
DEFAULT_ENCODINGS = ('rope', 'bipe_rope')
ALL_ENCODINGS = ('rope', 'bipe_rope', 'alibi', 'bipe_alibi')

# `make demo-dape`: DAPE's claim (Kerple vs DAPE-Kerple trained short, evaluated to 64x) and
# BiPE on top of DAPE-Kerple (in neither paper). The demo's budget except 1000 steps instead of
# 1500, chosen before any of the three was trained: a DAPE-Kerple step costs ~2.4x a Kerple
# step on the 2-core CPU (the MLP over all heads' scores at every (q, k)), and three runs at
# 1500 steps would take ~23 min there, over the 20 a demo may take.
DAPE_ENCODINGS = ('kerple', 'dape_kerple', 'bipe_dape_kerple')
DAPE_STEPS = 1000
DAPE_MULTIPLIERS = (1, 2, 4, 8, 16, 32, 64)
# A DAPE transform's training step relative to its bias-only baseline's (measured: DAPE-Kerple
# 1.9-2.3k tokens/s vs Kerple 4.4-5.0k at the same load, tiny preset, seq_len 64, batch 32).
TRANSFORM_STEP_COST = 2.4


@dataclasses.dataclass(frozen=True)
class DemoPlan:
  encodings: tuple[str, ...] = DEFAULT_ENCODINGS
  seq_len: int = 64
  steps: int = 1500
  parallel: int = 1  # training runs at once; when > 1 each gets one single-threaded device
  cpu_devices: int = 2  # single-threaded CPU devices per run when runs go one at a time
  batch_size: int = 32
  learning_rate: float = 2e-3  # the tiny preset's; warm-up is steps // 10, then cosine decay
  multipliers: tuple[int, ...] = (1, 2, 4, 8, 16)
  max_tokens: int = 65536  # validation tokens scored at every length
  config: str = 'configs/tiny.py'
  # Protocols the table is also printed under (bipe_jax/evaluation/protocols.py), e.g.
  # ('last:256',) for DAPE's; the demo's own protocol stays 'windows' (the official one).
  extra_protocols: tuple[str, ...] = ()
  data_dir: str = 'data_cache'
  output_dir: str = 'demo_out'

  @property
  def devices_per_run(self) -> int:
    return 1 if self.parallel > 1 else self.cpu_devices

  @property
  def warmup_steps(self) -> int:
    return max(1, self.steps // 10)

  @property
  def budget(self) -> dict:
    """The one training budget every encoding gets (recorded with the results)."""
    return {'steps': self.steps, 'seq_len': self.seq_len, 'batch_size': self.batch_size,
            'learning_rate': self.learning_rate, 'warmup_steps': self.warmup_steps,
            'schedule': 'linear warm-up, cosine decay', 'config': self.config,
            'tokens': self.steps * self.batch_size * self.seq_len}

  def budget_line(self) -> str:
    b = self.budget
    return (f'{b["steps"]} steps x {b["batch_size"]} sequences x {b["seq_len"]} tokens '
            f'({b["tokens"]:,} tokens), learning rate {b["learning_rate"]:g} with '
            f'{b["warmup_steps"]} warm-up steps and cosine decay, {b["config"]}')

  @property
  def lengths(self) -> list[int]:
    return [self.seq_len * m for m in self.multipliers]

  def workdir(self, encoding: str) -> str:
    return storage.join(self.output_dir, 'runs', segment_runs.label_dirname(encoding))

  def train_command(self, encoding: str) -> list[str]:
    """The training command of a run label ('bipe_rope', or 'bipe_rope@fixed:12' with a
    separator rule: bipe_jax/evaluation/segment_runs.py)."""
    steps = self.steps
    longest = max(self.lengths)
    workdir = self.workdir(encoding)
    encoding, rule = segment_runs.split_label(encoding)
    rule_flags = [f'--config.model.separators={rule}'] if rule else []
    return [
        sys.executable, TRAIN_SCRIPT, f'--config={os.path.join(ROOT, self.config)}',
        f'--workdir={workdir}',
        f'--cpu_devices={self.devices_per_run}',
        f'--config.model.position_encoding={encoding}',
        f'--config.data.seq_len={self.seq_len}',
        f'--config.data.data_dir={self.data_dir}',
        f'--config.model.max_intra={self.seq_len}',  # official: intra table = training length
        f'--config.model.max_position={longest}',  # only 'learned' uses it (untrained rows)
        f'--config.model.block_size={min(128, self.seq_len)}',
        f'--config.train.steps={steps}',
        f'--config.train.batch_size={self.batch_size}',
        f'--config.train.learning_rate={self.learning_rate}',
        f'--config.train.warmup_steps={self.warmup_steps}',
        f'--config.train.log_every={max(1, steps // 5)}',
        f'--config.checkpoint.every_steps={steps}',
    ] + rule_flags

  def validate(self) -> None:
    from bipe_jax import schemes  # pylint: disable=g-import-not-at-top
    if not self.encodings:
      raise ValueError(f'--encodings: (none) not valid; allowed: '
                       f'{", ".join(schemes.SCHEME_NAMES)}')
    for label in self.encodings:
      segment_runs.check_label(label, schemes.SCHEME_NAMES)
    for name in ('seq_len', 'steps', 'batch_size', 'max_tokens', 'parallel', 'cpu_devices'):
      if getattr(self, name) < (2 if name == 'seq_len' else 1):
        raise ValueError(f'--{name}={getattr(self, name)}: must be positive')
    if self.batch_size % self.devices_per_run:
      raise ValueError(f'--batch_size={self.batch_size} must divide by --cpu_devices='
                       f'{self.devices_per_run} (the batch is split across the devices)')
    if not 0 < self.learning_rate < 1:
      raise ValueError(f'--learning_rate={self.learning_rate}: must be in (0, 1)')
    if not self.multipliers or min(self.multipliers) < 1:
      raise ValueError(f'--multipliers={self.multipliers}: positive integers, e.g. 1,2,4,8,16')
    from bipe_jax.evaluation import protocols  # pylint: disable=g-import-not-at-top
    for text in self.extra_protocols:
      protocols.parse(text)
    if self.max_tokens < max(self.lengths):
      raise ValueError(f'--max_tokens={self.max_tokens} is smaller than the longest length '
                       f'{max(self.lengths)}')


def _finished_step(workdir: str) -> int:
  """The newest complete checkpoint step of a workdir (0 when none)."""
  ckpt = storage.join(workdir, 'checkpoints')
  if not storage.isdir(ckpt):
    return 0
  steps = [int(n) for n in storage.listdir(ckpt) if n.isdigit()]
  return max(steps, default=0)


def step_cost(encoding: str) -> float:
  """An encoding's training step relative to a plain one's, for the estimate."""
  from bipe_jax import schemes  # pylint: disable=g-import-not-at-top
  scheme = schemes.get_scheme(segment_runs.split_label(encoding)[0])
  return TRANSFORM_STEP_COST if scheme.transform != 'none' else 1.0


def estimate_seconds(plan: DemoPlan, data_ready: bool) -> float:
  todo = [e for e in plan.encodings if _finished_step(plan.workdir(e)) < plan.steps]
  side_by_side = min(plan.parallel, len(todo), 2)  # 2 cores: more runs at once gain nothing
  step = SECONDS_PER_STEP_SIDE_BY_SIDE if side_by_side > 1 else SECONDS_PER_STEP
  waves = math.ceil(len(todo) / max(side_by_side, 1))
  per_step = [step * step_cost(e) * plan.seq_len * plan.batch_size / (64 * 32) for e in todo]
  width = max(side_by_side, 1)  # a wave lasts as long as its slowest run
  train = sum(SECONDS_TRAIN_STARTUP + plan.steps * max(per_step[w * width:(w + 1) * width])
              for w in range(waves))
  evaluation = sum(SECONDS_EVAL_STARTUP + len(plan.lengths) * plan.max_tokens * step_cost(e)
                   / EVAL_TOKENS_PER_SECOND for e in plan.encodings)
  return (0 if data_ready else SECONDS_PREPARE) + train + evaluation


def train_environment(plan: DemoPlan, base: dict | None = None) -> dict:
  """The environment of a training subprocess: single-threaded XLA when runs go side by side.

  A user's own thread settings (NPROC, thread flags in XLA_FLAGS) are kept; other XLA_FLAGS
  are kept and the single-thread settings added (bipe_jax.kernels.cpu_devices).
  """
  env = dict(os.environ if base is None else base, PYTHONUNBUFFERED='1')
  if plan.parallel > 1:
    env = cpu_devices.single_thread_environment(env)
  return env


_children: set[subprocess.Popen] = set()  # the training subprocesses now running
_children_lock = threading.RLock()  # re-entrant: the handler may interrupt its holder
_stopping = threading.Event()  # set by a SIGTERM: no new training run starts


def terminate_training_runs(*_) -> None:
  """SIGTERM to every training subprocess (each saves a checkpoint and exits), and no new one
  starts; the demo's SIGTERM handler."""
  with _children_lock:
    _stopping.set()
    for proc in _children:
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)


def _refuse_after_sigterm(encoding: str) -> None:
  if _stopping.is_set():
    raise RuntimeError(f'stopped (SIGTERM) before training {encoding}: run the demo again to '
                       'resume')


def _copy_lines(source, sink) -> None:
  """Every line of the text stream `source` into `sink` (an `open_append` file), flushed. When
  the sink fails (a bucket gone), says so once and keeps reading `source` to its end, so the
  process writing it never blocks on a full pipe."""
  failed = False
  for line in source:
    if failed:
      continue
    try:
      sink.write(line)
      sink.flush()
    except Exception as e:  # pylint: disable=broad-except  (OSError, a bucket that is gone)
      failed = True
      print(f'warning: {getattr(sink, "name", "") or getattr(sink, "path", "the log")}: the '
            f'training log stops here: {e}', file=sys.stderr, flush=True)


def train_run(plan: DemoPlan, encoding: str, log) -> float:
  """Trains (or resumes / skips) one encoding in a subprocess; returns its wall time.

  Raises RuntimeError when the subprocess fails, or ends (preempted) before `plan.steps`.
  """
  workdir = plan.workdir(encoding)
  if _finished_step(workdir) >= plan.steps:
    log(f'[{encoding}] already trained to step {plan.steps} in {workdir}: reusing it')
    return 0.0
  _refuse_after_sigterm(encoding)
  cmd = plan.train_command(encoding)
  command_file = storage.join(workdir, 'command.txt')
  storage.write_text_atomic(command_file, ' '.join(['python'] + cmd[1:]) + '\n')
  log(f'[{encoding}] training in {workdir} (its command: {command_file}; its log: train.log)')
  start = time.perf_counter()
  train_log = storage.join(workdir, 'train.log')
  err = storage.open_append(train_log, min_interval_s=10.0)  # a local file, or objects
  try:
    with _children_lock:
      _refuse_after_sigterm(encoding)  # again: a SIGTERM may have come since the first check
      proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=train_environment(plan))
      _children.add(proc)
    copier = threading.Thread(target=_copy_lines, args=(proc.stderr, err), daemon=True)
    copier.start()
    try:
      for line in proc.stdout:
        log(f'[{encoding}] {line.rstrip()}')
      code = proc.wait()
      copier.join()
    finally:
      with _children_lock:
        _children.discard(proc)
  finally:
    err.close()
  if code not in (0, cli.EXIT_PREEMPTED):  # preempted: said below, from the step reached
    tail = ''.join(storage.read_appended(train_log).splitlines(keepends=True)[-15:])
    raise RuntimeError(f'training {encoding} failed with exit code {code}; the end of '
                       f'{workdir}/train.log:\n{tail}')
  reached = _finished_step(workdir)
  if reached < plan.steps:
    raise RuntimeError(f'training {encoding} stopped at step {reached} of {plan.steps} '
                       f'(preempted); its checkpoint is in {workdir}: run the demo again to '
                       'resume')
  return time.perf_counter() - start


# The papers' claims the demo checks, as (variant, its baseline, multiplier, largest ratio);
# None: a comparison neither paper makes, printed without a verdict. DAPE's: trained at 128
# and evaluated at 8192 (64x), Kerple 8.30 -> 12.59 and DAPE-Kerple 8.21 -> 4.97 (ratios 0.99
# at 1x, 0.39 at 64x; the paper scores the last 256 tokens of each block).
PAPER_CLAIMS: tuple[tuple[str, str, int, float | None], ...] = (
    ('bipe_rope', 'rope', 8, 0.9),
    ('bipe_rope', 'rope', 16, 0.8),
    ('bipe_alibi', 'alibi', 16, 1.05),
    ('dape_kerple', 'kerple', 1, 1.0),
    ('dape_kerple', 'kerple', 64, 0.4),
    ('bipe_dape_kerple', 'dape_kerple', 64, None),
    ('bipe_dape_kerple', 'kerple', 64, None),
)


def paper_comparison(plan: DemoPlan, perplexities: dict[str, dict[int, float]]) -> list[str]:
  """One line per paper claim whose two encodings were run: the measured ratio and a verdict.

  `perplexities` maps encoding -> {length: perplexity}. A claim is 'holds' when
  ppl(BiPE) <= ratio * ppl(baseline) at that multiple of the training length, else 'does NOT
  hold' — stated either way, never hidden.
  """
  lines = []
  for bipe, base, multiple, ratio in PAPER_CLAIMS:
    length = plan.seq_len * multiple
    if not (bipe in perplexities and base in perplexities
            and length in perplexities[bipe] and length in perplexities[base]):
      continue
    measured = perplexities[bipe][length] / perplexities[base][length]
    head = f'{bipe} / {base} at {multiple}x ({length} tokens): {measured:.3f}'
    if ratio is None:
      lines.append(f'{head} (in neither paper: no target)')
      continue
    verdict = 'holds' if measured <= ratio else 'does NOT hold'
    lines.append(f'{head} (target <= {ratio}) — {verdict}')
  return lines


def markdown_report(plan: DemoPlan, document: dict, *, command: str, wall_seconds: float,
                    train_seconds: dict, eval_seconds: dict) -> str:
  """DEMO_RESULTS.md: the budget, the table, the paper comparison, the command, timings."""
  from bipe_jax.evaluation import perplexity as ppl  # pylint: disable=g-import-not-at-top
  results = {e['label']: [ppl.LengthResult(r['length'], r['blocks'], r['tokens'], r['nll_sum'])
                          for r in e['results']] for e in document['runs']}
  trained = lambda k: (f'{train_seconds[k]:.0f} s' if train_seconds[k] else  # 0: train_run
                       'reused from an earlier run')                           # reused it
  timing = ', '.join(f'{k} {trained(k)} + eval {eval_seconds[k]:.0f} s' for k in train_seconds)
  comparison = paper_comparison(plan, {k: {r.length: r.perplexity for r in v}
                                       for k, v in results.items()})
  extra_tables = []
  for text, by_encoding in document.get('extra_protocols', {}).items():
    rows = {e: [ppl.LengthResult(r['length'], r['blocks'], r['tokens'], r['nll_sum'])
                for r in rs] for e, rs in by_encoding.items()}
    extra_tables += ['', f'The same runs under protocol `{text}` '
                     '(bipe_jax/evaluation/protocols.py):', '', ppl.format_markdown(rows)]
  return '\n'.join([
      f'# Demo results ({document["date"]})',
      '',
      f'Command: `{command}` — wall time {wall_seconds / 60:.1f} min on '
      f'{os.cpu_count()} CPU cores ({timing}).',
      '',
      f'Budget, the same for every encoding and chosen before comparing them: '
      f'{plan.budget_line()}. Tiny preset (4 layers, width 128, 4 heads, vocab 4096) trained on '
      f'the embedded corpus (CPython docs + stdlib code); evaluated on the same '
      f'{plan.max_tokens:,} validation tokens cut into non-overlapping blocks of each length '
      f'(official protocol; "tokens scored" = targets per length). Perplexity (lower is better):',
      '',
      ppl.format_markdown(results),
      *extra_tables,
      '',
      'The paper\'s claims at this scale:',
      '',
      *(f'- {line}' for line in comparison or ['(no BiPE / baseline pair was run)']),
      '',
      '![perplexity vs length](ppl.png)',
      '',
      '![loss by token position at the longest length](positions.png)',
      '',
  ])


def run_demo(plan: DemoPlan, *, command: str, log=print) -> dict:
  """The whole demo; returns the results document (also written to plan.output_dir)."""
  plan.validate()
  wall_start = time.perf_counter()
  log_file = storage.join(plan.output_dir, 'demo.log')
  file_handler = run_logging.send_library_logs_to(log_file)
  _stopping.clear()
  in_main_thread = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, terminate_training_runs) if in_main_thread else None
  try:
    return _run_demo(plan, command=command, log=log, wall_start=wall_start, log_file=log_file)
  finally:
    if in_main_thread:
      signal.signal(signal.SIGTERM, previous)
    logging.getLogger().removeHandler(file_handler)
    file_handler.close()


def _run_demo(plan: DemoPlan, *, command: str, log, wall_start: float, log_file: str) -> dict:
  from bipe_jax import data  # pylint: disable=g-import-not-at-top
  from bipe_jax import defaults  # pylint: disable=g-import-not-at-top
  from bipe_jax.evaluation import perplexity as ppl  # pylint: disable=g-import-not-at-top
  from bipe_jax.runs import restore as runs_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.evaluation import sweep  # pylint: disable=g-import-not-at-top
  from bipe_jax.evaluation import position_plot  # pylint: disable=g-import-not-at-top

  data_config = defaults.data_defaults()
  data_config.data_dir = plan.data_dir
  data_ready = storage.isdir(storage.join(plan.data_dir, 'bipe_embedded'))
  expected = estimate_seconds(plan, data_ready)
  log(f'demo: {len(plan.encodings)} encodings ({", ".join(plan.encodings)}), evaluated at '
      f'lengths {plan.lengths}')
  log(f'demo: one budget for every encoding: {plan.budget_line()}')
  log(f'demo: expected to take about {expected / 60:.0f} minutes on 2 CPU cores '
      f'(longer when the machine is busy); output in {plan.output_dir}/, library logs in '
      f'{log_file}')
  start = time.perf_counter()
  prepared = data.prepare(data_config)
  log(f'demo: embedded corpus and tokenizer ready in {time.perf_counter() - start:.0f} s '
      f'({prepared.version_dir})')
  if any(segment_runs.split_label(e)[1] == segment_runs.AUTO_FIXED for e in plan.encodings):
    mean = segment_runs.corpus_mean_segment_length(data_config)
    plan = dataclasses.replace(plan, encodings=segment_runs.resolve_auto(
        plan.encodings, max(1, round(mean))))
    log(f'demo: the corpus\'s mean segment length (sentence rule, train split) is {mean:.2f} '
        f'tokens: {segment_runs.AUTO_FIXED} -> fixed:{max(1, round(mean))} '
        f'({", ".join(plan.encodings)})')

  train_seconds, eval_seconds, entries, tables = {}, {}, [], {}
  extra = {text: {} for text in plan.extra_protocols}  # protocol -> encoding -> results
  with concurrent.futures.ThreadPoolExecutor(max_workers=plan.parallel) as pool:
    futures = {e: pool.submit(train_run, plan, e, log) for e in plan.encodings}
    for encoding, future in futures.items():
      train_seconds[encoding] = future.result()
  for encoding in plan.encodings:
    start = time.perf_counter()
    run = runs_lib.load_run(plan.workdir(encoding))
    results = sweep.evaluate_run(run, plan.lengths, max_tokens=plan.max_tokens,
                                 data_config=data_config, per_position=True)
    for text in plan.extra_protocols:
      extra[text][encoding] = sweep.evaluate_run(run, plan.lengths, protocol=text,
                                                 max_tokens=plan.max_tokens,
                                                 data_config=data_config)
    eval_seconds[encoding] = time.perf_counter() - start
    log(f'[{encoding}] evaluated step {run.step} at lengths {plan.lengths[0]}..'
        f'{plan.lengths[-1]} in {eval_seconds[encoding]:.0f} s: perplexity '
        + ', '.join(f'{r.perplexity:.1f}' for r in results))
    entries.append(sweep.run_entry(encoding, run, results))
    tables[encoding] = results
  wall = time.perf_counter() - wall_start

  document = sweep.results_document(entries, protocol='blocks', stride=None,
                                    max_tokens=plan.max_tokens, command=command)
  document['budget'] = plan.budget
  document['paper_comparison'] = paper_comparison(
      plan, {k: {r.length: r.perplexity for r in v} for k, v in tables.items()})
  document['wall_seconds'] = wall
  document['expected_seconds'] = expected
  document['train_seconds'] = train_seconds
  document['eval_seconds'] = eval_seconds
  document['extra_protocols'] = {
      text: {e: [r.to_dict() for r in rows] for e, rows in by_encoding.items()}
      for text, by_encoding in extra.items()}
  sweep.write_json(document, storage.join(plan.output_dir, 'results.json'))
  sweep.plot_document(document, storage.join(plan.output_dir, 'ppl.png'))
  position_plot.plot_document_positions(document, storage.join(plan.output_dir,
                                                                'positions.png'))
  report = markdown_report(plan, document, command=command, wall_seconds=wall,
                           train_seconds=train_seconds, eval_seconds=eval_seconds)
  storage.write_text_atomic(storage.join(plan.output_dir, 'DEMO_RESULTS.md'), report)
  log('')
  log(f'perplexity by evaluation length (trained at {plan.seq_len}; lower is better):')
  log(ppl.format_table(tables))
  for text, by_encoding in extra.items():
    log('')
    log(f'the same, protocol {text} (bipe_jax/evaluation/protocols.py):')
    log(ppl.format_table(by_encoding))
  log('')
  for line in document['paper_comparison']:
    log(f'paper claim: {line}')
  log(f'demo: done in {wall / 60:.1f} min (expected {expected / 60:.0f}); wrote '
      f'{plan.output_dir}/results.json, {plan.output_dir}/ppl.png, '
      f'{plan.output_dir}/positions.png (loss by position), '
      f'{plan.output_dir}/DEMO_RESULTS.md ({datetime.date.today().isoformat()})')
  return document


def parse_ints(text: str, flag: str) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in str(text).split(',') if x.strip())
  except ValueError:
    raise ValueError(f'--{flag}={text!r}: expected comma-separated integers') from None


def parse_names(text: str) -> tuple[str, ...]:
  return tuple(x.strip() for x in str(text).split(',') if x.strip())


def main(plan: DemoPlan, command: str) -> int:
  try:
    run_demo(plan, command=command)
  except (ValueError, RuntimeError) as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  return 0


__all__: Sequence[str] = ('DemoPlan', 'run_demo', 'estimate_seconds', 'main')
