"""Accuracy against depth and number of operators on the arithmetic task, trained to convergence.

  python eval/arithmetic_sweep.py --root=runs/arith_sweep
  python eval/arithmetic_sweep.py --root=runs/arith_sweep --layers=1,2 --ops=5 \
      --config.model.hidden_size=128

Every (encoding, layers, N) run is trained on problems of 1..N operators until its held-out
accuracy at N converges, then scored at 1..N+extra_ops operators; rerunning the command resumes
(and, with a higher --max_steps, continues the runs stopped at the old cap).
All logic lives in bipe_jax.evaluation.arithmetic_sweep (docs/arithmetic_task.md).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file(
    'config', os.path.join(ROOT, 'configs', 'arithmetic_tiny.py'),
    'Base config of every run (override fields with --config.section.field=value).')
_ROOT = flags.DEFINE_string('root', None, 'Directory of the runs and of arithmetic_sweep.json.')
_ENCODINGS = flags.DEFINE_list('encodings', ['rope', 'bipe_rope'], 'Position encodings.')
_LAYERS = flags.DEFINE_list('layers', ['1', '2', '3'], 'Depths (model.num_layers).')
_OPS = flags.DEFINE_list('ops', ['4', '5', '6'], 'Operator counts N (train on 1..N).')
_CHUNK = flags.DEFINE_integer('chunk_steps', 500, 'Training steps between accuracy checks.')
_MAX_STEPS = flags.DEFINE_integer('max_steps', 20000, 'Most training steps of a run.')
_PATIENCE = flags.DEFINE_integer('patience', 4, 'Checks without improvement before stopping.')
_MIN_DELTA = flags.DEFINE_float('min_delta', 0.01, 'Improvement that counts.')
_TARGET = flags.DEFINE_float('target_accuracy', 0.995, 'Accuracy at N that ends a run.')
_PER_LENGTH = flags.DEFINE_integer('per_length', 200, 'Problems per accuracy check.')
_FINAL = flags.DEFINE_integer('final_per_length', 500, 'Problems per count in the final scoring.')
_EXTRA = flags.DEFINE_integer('extra_ops', 2, 'Final scoring also at N+1..N+extra_ops.')
flags.mark_flags_as_required(['root'])


def _ints(flag) -> tuple:
  try:
    return tuple(int(x) for x in flag.value)
  except ValueError:
    raise ValueError(f'--{flag.name}={",".join(flag.value)}: expected integers') from None


def main(argv):
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()  # a CPU run's set-up (freed memory kept), before JAX starts
  from bipe_jax.evaluation import arithmetic_sweep  # pylint: disable=g-import-not-at-top
  try:
    plan = arithmetic_sweep.SweepPlan(
        encodings=tuple(_ENCODINGS.value), layers=_ints(_LAYERS), max_ops=_ints(_OPS),
        chunk_steps=_CHUNK.value,
        max_steps=_MAX_STEPS.value, patience=_PATIENCE.value, min_delta=_MIN_DELTA.value,
        target_accuracy=_TARGET.value, per_length=_PER_LENGTH.value,
        final_per_length=_FINAL.value, extra_ops=_EXTRA.value)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return arithmetic_sweep.main(plan, _CONFIG.value, _ROOT.value)


if __name__ == '__main__':
  cli.run(main)
