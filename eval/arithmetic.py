"""Accuracy of the arithmetic chain-of-thought task by problem length, from training workdirs.

  python train/main.py --config=configs/arithmetic_tiny.py:rope --workdir=runs/arith_rope
  python eval/arithmetic.py --workdir=runs/arith_rope --workdir=runs/arith_bipe_rope

Greedy-decodes `per_length` held-out problems for every operator count (the training range and
the longer evaluation range) and prints exact-match accuracy of the final answer (and of the
whole step-by-step solution). All logic lives in bipe_jax.evaluation.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKDIR = flags.DEFINE_multi_string('workdir', [], 'Training workdir (repeatable).')
_PER_LENGTH = flags.DEFINE_integer('per_length', 100, 'Problems per operator count.')
_BATCH = flags.DEFINE_integer('batch_size', 100, 'Problems decoded together.')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
_ATTENTION = flags.DEFINE_enum('attention_impl', 'blockwise', ['blockwise', 'dense'],
                               'Attention path at evaluation.')
_OUTPUT = flags.DEFINE_string('output', '', 'JSON results file ("" = none).')


def main(argv):
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()  # a CPU run's set-up (freed memory kept), before JAX starts
  from bipe_jax.evaluation import cli as eval_cli  # pylint: disable=g-import-not-at-top
  return eval_cli.arithmetic_main(
      workdirs=_WORKDIR.value, per_length=_PER_LENGTH.value, batch_size=_BATCH.value,
      step=_STEP.value, attention_impl=_ATTENTION.value, output=_OUTPUT.value,
      command=' '.join(['python eval/arithmetic.py'] + sys.argv[1:]))


if __name__ == '__main__':
  cli.run(main)
