"""The flags and the run shared by eval/che.py (one task x encoding) and eval/che_sweep.py
(a grid): budget, scoring plan, BiPE segmentation, output directory. Bad values end the run with
one line naming the flag; finished cells already written are kept."""

import time
from typing import Sequence

from absl import flags

from bipe_jax import cli
from bipe_jax import schemes
from bipe_jax.che import cell as cell_lib
from bipe_jax.che import model as che_model
from bipe_jax.che import scoring
from bipe_jax.che import segments
from bipe_jax.che import sweep
from bipe_jax.che import training
from bipe_jax.encodings import randomized
from bipe_jax.tasks import che as tasks

FLAGS = flags.FLAGS


def define_common() -> None:
  b, p = training.Budget(), cell_lib.EvalPlan()
  flags.DEFINE_list('seeds', ['0'], 'Seeds (model init and data).')
  flags.DEFINE_integer('steps', b.steps, 'Training steps per cell.')
  flags.DEFINE_integer('batch_size', b.batch_size, 'Training batch size.')
  flags.DEFINE_float('learning_rate', b.learning_rate, 'Adam learning rate.')
  flags.DEFINE_string('eval_lengths', p.lengths,
                      "Scored lengths: 'A-B[:STEP],N,...' (the benchmark: 1-500).")
  flags.DEFINE_integer('eval_samples', p.samples, 'Rows scored per length.')
  flags.DEFINE_integer('bucket', p.bucket, 'Rows are padded to a multiple of this many tokens.')
  flags.DEFINE_integer('randomized_positions', 0, 'L > 0: randomized positions (Ruoss et al. '
                       '2023; the benchmark: 2048), each row an ordered random subset of '
                       '0..L-1, in training and scoring; 0 = off.')
  flags.DEFINE_string('architecture', 'project',
                      "The encoder block: 'project' (this project's: pre-RMSNorm, SwiGLU, no "
                      "dropout) or 'peer' (the benchmark's: post-LayerNorm, ReLU MLP, dropout "
                      "0.1, embeddings x sqrt(D), biased MLP and head; bipe_jax/che/peer.py).")
  flags.DEFINE_string('segmentation', 'task',
                      "BiPE's segments on CHE: none | task | fixed:K (bipe_jax/che/segments.py).")
  flags.DEFINE_string('output_dir', 'che_out', 'Where cells, results.json, table.md, PNGs go.')
  flags.DEFINE_string('shard', '', "'I/N': run only every N-th (task, encoding) pair from the "
                      'I-th (0-based), writing cells only: N processes share a grid; a last run '
                      'without --shard writes the summary (bipe_jax/che/sweep.py).')
  flags.DEFINE_string('queue_dir', '', 'Processes running the same grid with the same queue_dir '
                      'share its (task, encoding) pairs: each takes the next unclaimed one '
                      '(a directory per pair here), writing cells only; a last run without it '
                      'writes the summary (eval/che_sweep_shards.sh does all this).')

  flags.DEFINE_bool('assemble_only', False, 'Write results.json, table.md and the PNGs from the '
                    'cells finished so far; train nothing.')


def parse_shard(spec: str):
  """'' -> None; 'I/N' -> (I, N) with 0 <= I < N."""
  if not spec:
    return None
  try:
    i, n = (int(x) for x in spec.split('/'))
    if not 0 <= i < n:
      raise ValueError
  except ValueError:
    raise ValueError(f"--shard={spec!r} must be 'I/N' with 0 <= I < N.") from None
  return i, n


def run(task_names: Sequence[str], encodings: Sequence[str], command: str) -> int:
  start = time.perf_counter()
  try:
    for t in task_names:
      tasks.get_task(t)
    for e in encodings:
      schemes.get_scheme(e)
    seeds = [int(s) for s in FLAGS.seeds]
    segments.parse(FLAGS.segmentation)
    scoring.parse_lengths(FLAGS.eval_lengths)
    shard = parse_shard(FLAGS.shard)
    che_model.check_architecture(FLAGS.architecture)
    for name in ('steps', 'batch_size', 'eval_samples', 'bucket'):
      if getattr(FLAGS, name) < 1:
        raise ValueError(f'--{name}={getattr(FLAGS, name)} must be >= 1.')
    if FLAGS.randomized_positions < 0:
      raise ValueError(f'--randomized_positions={FLAGS.randomized_positions} must be >= 0 '
                       '(0 = off).')
    if FLAGS.randomized_positions:
      for e in encodings:
        if why := randomized.refusal(schemes.get_scheme(e)):
          raise ValueError(f'--randomized_positions={FLAGS.randomized_positions} with '
                           f'--encoding={e}: {why}.')
  except ValueError as e:
    cli.fail(str(e))
  budget = training.Budget(steps=FLAGS.steps, batch_size=FLAGS.batch_size,
                           learning_rate=FLAGS.learning_rate)
  plan = cell_lib.EvalPlan(lengths=FLAGS.eval_lengths, samples=FLAGS.eval_samples,
                           bucket=FLAGS.bucket)
  try:
    summary = sweep.run_grid(task_names, encodings, seeds, budget, plan, FLAGS.output_dir,
                             segmentation=FLAGS.segmentation, command=command, shard=shard,
                             queue_dir=FLAGS.queue_dir or None,
                             train_missing=not FLAGS.assemble_only,
                             randomized_positions=FLAGS.randomized_positions,
                             architecture=FLAGS.architecture)
  except ValueError as e:
    cli.fail(str(e))
  print(f'\nCHE score x 100 (mean accuracy over {summary["scored_lengths"]}; trained on 1..40; '
        f'{budget.steps} steps, batch {budget.batch_size}, lr {budget.learning_rate}; '
        f'BiPE segments: {FLAGS.segmentation}; block: {FLAGS.architecture}):')
  print(summary['table'])
  split = shard or FLAGS.queue_dir
  written = 'cells/ of this process' if split else 'results.json, table.md, TASK.png'
  print(f'written to {FLAGS.output_dir}/ ({written}); '
        f'wall time {time.perf_counter() - start:.0f}s')
  return 0
