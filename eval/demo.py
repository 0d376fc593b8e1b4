"""What `make demo` runs: the embedded corpus, rope and bipe_rope (alibi and bipe_alibi are one
flag away: `make demo-all`) trained with one budget at a short length on the tiny preset, evaluated at 1x..16x
that length; one table side by side, the paper's claims checked, JSON, Markdown and a PNG.

  python eval/demo.py --output_dir=demo_out [--encodings=rope,bipe_rope,alibi,bipe_alibi]
      [--extra_protocols=last:256] [--steps=1500] [--cpu_devices=2] [--parallel=1] [--seq_len=64] [--multipliers=1,2,4,8,16] [--max_tokens=65536]

Running it again reuses finished training runs in <output_dir>/runs/. All logic lives in
bipe_jax.evaluation.demo.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from bipe_jax import storage  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.evaluation import demo  # pylint: disable=g-import-not-at-top,wrong-import-position

_D = demo.DemoPlan()
_OUTPUT_DIR = flags.DEFINE_string('output_dir', _D.output_dir, 'Where runs and results go.')
_ENCODINGS = flags.DEFINE_string('encodings', ','.join(_D.encodings), 'Encodings to train.')
_STEPS = flags.DEFINE_integer('steps', _D.steps, 'Training steps per encoding.')
_SEQ_LEN = flags.DEFINE_integer('seq_len', _D.seq_len, 'Training length.')
_BATCH = flags.DEFINE_integer('batch_size', _D.batch_size, 'Global batch (sequences).')
_LR = flags.DEFINE_float('learning_rate', _D.learning_rate,
                         'Peak learning rate (the same for every encoding).')
_MULTIPLIERS = flags.DEFINE_string('multipliers', ','.join(map(str, _D.multipliers)),
                                   'Evaluation lengths as multiples of the training length.')
_MAX_TOKENS = flags.DEFINE_integer('max_tokens', _D.max_tokens,
                                   'Validation tokens scored at every length.')
_PARALLEL = flags.DEFINE_integer('parallel', _D.parallel,
                                 'Training runs at once (default 1; more runs side by side get one thread each).')
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', _D.cpu_devices, 'Single-threaded CPU devices per training run (runs one '
    'at a time); 1 = one device using every core.')
_EXTRA_PROTOCOLS = flags.DEFINE_string(
    'extra_protocols', '', 'Comma-separated protocols the table is also printed under '
    '(e.g. last:256; the demo\'s own is windows).')
_DATA_DIR = flags.DEFINE_string('data_dir', _D.data_dir, 'Where the embedded corpus is built.')


def main(argv):
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()  # a CPU run's set-up (freed memory kept), before JAX starts
  try:
    plan = demo.DemoPlan(
        encodings=demo.parse_names(_ENCODINGS.value), seq_len=_SEQ_LEN.value,
        steps=_STEPS.value, batch_size=_BATCH.value, learning_rate=_LR.value,
        multipliers=demo.parse_ints(_MULTIPLIERS.value, 'multipliers'),
        max_tokens=_MAX_TOKENS.value, parallel=_PARALLEL.value,
        cpu_devices=_CPU_DEVICES.value, data_dir=storage.absolute(_DATA_DIR.value),
        output_dir=storage.absolute(_OUTPUT_DIR.value),
        extra_protocols=demo.parse_names(_EXTRA_PROTOCOLS.value))
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return demo.main(plan, ' '.join(['python eval/demo.py'] + sys.argv[1:]))


if __name__ == '__main__':
  cli.run(main)
