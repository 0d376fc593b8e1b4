"""Passkey retrieval by context length and depth, from training workdirs.

  python train/main.py --config=configs/passkey_tiny.py:bipe_rope --workdir=runs/pk_bipe_rope
  python eval/passkey.py --workdir=runs/pk_bipe_rope --workdir=runs/pk_rope \
      --lengths=64,128,256,512 --output=passkey.json --plot=passkey.png

A run of the synthetic task (configs/passkey_tiny.py) is probed with its own samples; any other
run with the standard text probe under its own tokenizer. Prints a table (accuracy per depth,
one row per run and length), writes JSON and a heat map. All logic lives in bipe_jax.evaluation.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKDIR = flags.DEFINE_multi_string('workdir', [], 'Training workdir (repeatable).')
_LENGTHS = flags.DEFINE_list('lengths', ['64', '128', '256', '512'], 'Context lengths (tokens).')
_DEPTHS = flags.DEFINE_list('depths', ['0', '0.25', '0.5', '0.75', '1'],
                            'Depths of the key (0 = start, 1 = just before the question).')
_TRIALS = flags.DEFINE_integer('trials', 20, 'Probes per (length, depth).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the probes.')
_BATCH = flags.DEFINE_integer('batch_size', 16, 'Rows per forward pass (at length 512).')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
_ATTENTION = flags.DEFINE_enum('attention_impl', 'blockwise', ['blockwise', 'dense', 'fused'],
                               'Attention path at evaluation.')
_OUTPUT = flags.DEFINE_string(
    'output', 'auto', 'JSON results file ("auto": passkey.json in the (first) workdir; "" = none).')
_PLOT = flags.DEFINE_string('plot', '', 'Heat-map PNG ("" = none).')


def main(argv):
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()  # a CPU run's set-up (freed memory kept), before JAX starts
  from bipe_jax.evaluation import cli as eval_cli  # pylint: disable=g-import-not-at-top
  try:
    lengths = [int(x) for x in _LENGTHS.value]
    depths = [float(x) for x in _DEPTHS.value]
  except ValueError as e:
    print(f'error: --lengths / --depths: {e}', file=sys.stderr)
    return 2
  return eval_cli.passkey_main(
      workdirs=_WORKDIR.value, lengths=lengths, depths=depths, trials=_TRIALS.value,
      seed=_SEED.value, batch_size=_BATCH.value, step=_STEP.value,
      attention_impl=_ATTENTION.value, output=_OUTPUT.value, plot_path=_PLOT.value,
      command=' '.join(['python eval/passkey.py'] + sys.argv[1:]))


if __name__ == '__main__':
  cli.run(main)
