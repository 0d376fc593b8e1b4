"""Compile the training step for a TPU slice or GPU hosts on this host (no accelerator needed)
and print per-chip memory, FLOPs and collectives, then (TPU) the predicted step time, tokens/s,
MFU and hours for the preset's token budget (XLA's TPU cost model: an estimate, not a
measurement; --nopredict skips):

  python train/compile.py --config=configs/paper_151m.py:bipe_rope --topology=v5e:2x4
  python train/compile.py --config=configs/paper_151m.py:bipe_alibi --platform=cuda --topology=h100:8

--platform=cuda needs the CUDA compiler plugin (make setup-cuda, into .venv/cuda-plugin); without
it the step is lowered for CUDA and its summary printed (exit code 3).

Takes train/main.py's --config flags (--config.model.remat=full, ...). Needs the TPU compiler
(pip install -r requirements-tpu.txt). Exit codes: 0 the step fits every chip's HBM, 1 it does
not (one line naming what would help), 2 a bad flag, config or topology. All logic lives in
bipe_jax.compile.aot.
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
_TOPOLOGY = flags.DEFINE_string('topology', '',
                                'TPU topology: v5e:2x4 (the default on --platform=tpu), v4:2x2x1, '
                                'v5p:2x2x1, v6e:2x2, ...; with --platform=cuda (no default there) '
                                'GPU:COUNT or GPU:HOSTSxCOUNT: h100:8, h200:2x8, a100:8, or local '
                                '(this host\'s own GPUs)')
_PLATFORM = flags.DEFINE_enum('platform', 'tpu', ['tpu', 'cuda'],
                              'Compile for TPU topologies (libtpu) or CUDA GPUs (the CUDA plugin).')
_NUM_SLICES = flags.DEFINE_integer('num_slices', 1, 'Number of slices of that topology '
                                   '(multislice; the mesh spans all their chips).')
_EVAL_LENGTHS = flags.DEFINE_list('eval_lengths', [], 'Also compile the evaluation forward at '
                                  'these lengths (comma-separated).')
_EVAL_BATCH = flags.DEFINE_integer('eval_batch_size', 0, 'Rows per evaluation batch '
                                   '(0 = train.batch_size).')
_OUTPUT = flags.DEFINE_string('output', '', 'Write the figures as JSON to this file.')
_PREDICT = flags.DEFINE_bool('predict', True, "Also print the step time, tokens/s and MFU per "
                             "chip and the hours for train.steps, from XLA's TPU cost model "
                             '(an estimate; two more compiles, of 1 and 2 unrolled layers).')
flags.mark_flags_as_required(['config'])


CUDA_PLUGIN_FOLDER = os.path.join(ROOT, '.venv', 'cuda-plugin')  # make setup-cuda


def main(argv):
  del argv
  if _PLATFORM.value == 'cuda' and os.path.isdir(CUDA_PLUGIN_FOLDER):
    # before JAX starts its backends: JAX finds the plugin's entry point on sys.path then
    sys.path.insert(0, CUDA_PLUGIN_FOLDER)
  from bipe_jax.compile import cli as compile_cli  # pylint: disable=g-import-not-at-top
  sys.exit(compile_cli.run(_CONFIG.value, _TOPOLOGY.value, num_slices=_NUM_SLICES.value,
                           eval_lengths=_EVAL_LENGTHS.value, eval_batch_size=_EVAL_BATCH.value,
                           output=_OUTPUT.value, platform=_PLATFORM.value,
                           predict=_PREDICT.value))


if __name__ == '__main__':
  cli.run(main)  # a CPU host: JAX's CPU platform, no TPU probe (bipe_jax.platforms)
