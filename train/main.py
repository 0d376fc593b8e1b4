"""Train a model: `python train/main.py --config=configs/tiny.py --workdir=DIR [--config.x=y]`.

Running the same command again resumes from the workdir's latest checkpoint. Multi-host:
automatic on a Cloud TPU VM, SLURM and Open MPI; elsewhere add --coordinator_address=host:port
--num_processes=N --process_id=i on every process (docs/multihost.md). All logic lives in
bipe_jax.training.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)  # so config files can `from configs import base`

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file (configs/*.py).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and logs.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', '',
                                   'host:port of process 0 (multi-process runs).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', 0, 'Number of processes.')
_PROCESS_ID = flags.DEFINE_integer('process_id', -1, 'This process index.')
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', 1, 'On a CPU host: split it into this many single-threaded JAX devices and '
    'train data-parallel across them (2 on a 2-core machine is ~1.3x faster than 1; the global '
    'batch must divide by it; with model.kernels cpu or auto). Inert on GPU/TPU. Default 1: '
    'JAX\'s single CPU device.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  del argv
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  try:  # a CPU run's set-up (model.kernels: cpu devices, freed memory kept), before JAX starts
    process_setup.setup_process(_CONFIG.value.model.get('kernels', 'auto'), _CPU_DEVICES.value)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  from bipe_jax.training import cli as train_cli  # pylint: disable=g-import-not-at-top
  train_cli.end_process(train_cli.run(
      _CONFIG.value, _WORKDIR.value, coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
      library_log=not flags.FLAGS['verbosity'].present))


if __name__ == '__main__':
  cli.run(main)
