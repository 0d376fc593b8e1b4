"""Chomsky-hierarchy length generalisation (DAPE's CHE): train and score one (task, encoding).

  python eval/che.py --task=parity_check --encoding=rope --seeds=0 --output_dir=che_out

Trains the benchmark's encoder (5 layers x width 64, model.causal=False) with the uniform length
curriculum 1..40 and scores it at --eval_lengths (mean accuracy over 41..500 = the score);
its blocks are this project's, or with --architecture=peer the benchmark's own (post-LayerNorm,
ReLU MLP, dropout 0.1: bipe_jax/che/peer.py).
Writes che_out/cells/TASK__ENCODING__seedS.json, results.json, table.md and TASK.png. All logic
lives in bipe_jax.che.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.che import flags as che_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_TASK = flags.DEFINE_string('task', 'parity_check', 'CHE task (bipe_jax.tasks.che.TASK_NAMES).')
_ENCODING = flags.DEFINE_string('encoding', 'rope', 'model.position_encoding.')
che_flags.define_common()
# --help lists the common flags too (absl lists only a program's own flags by default)
flags.adopt_module_key_flags(che_flags)


def main(argv):
  del argv
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()  # a CPU run's set-up, before JAX starts
  return che_flags.run([_TASK.value], [_ENCODING.value],
                       command=' '.join(['python eval/che.py'] + sys.argv[1:]))


if __name__ == '__main__':
  cli.run(main)
