"""Chomsky-hierarchy length generalisation: a grid of tasks x encodings x seeds, resumable.

  python eval/che_sweep.py --tasks=parity_check,reverse_string --encodings=rope,alibi \
      --seeds=0,1,2 --output_dir=che_grid_out

Each finished cell is written at once (output_dir/cells/); rerunning the same command skips them.
Prints the table (score x 100: mean +- std over seeds) and the wall time. Logic: bipe_jax.che.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.che import flags as che_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_TASKS = flags.DEFINE_list('tasks', ['parity_check', 'reverse_string'], 'CHE tasks.')
_ENCODINGS = flags.DEFINE_list('encodings', ['rope', 'kerple', 'dape_kerple'], 'Encodings.')
che_flags.define_common()
# --help lists the common flags too (absl lists only a program's own flags by default)
flags.adopt_module_key_flags(che_flags)


def main(argv):
  del argv
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()  # a CPU run's set-up, before JAX starts
  return che_flags.run(_TASKS.value, _ENCODINGS.value,
                       command=' '.join(['python eval/che_sweep.py'] + sys.argv[1:]))


if __name__ == '__main__':
  cli.run(main)
