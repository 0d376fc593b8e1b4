"""Pictures of what a run learned: the positional bias of one query over all keys (static, and
DAPE's adapted one: DAPE's Figure 1) and the attention map of one layer and head on a real text
window, as PNGs plus the numbers in JSON.

  python eval/visualize.py --workdir=RUN [--query=0 (16x the training length)] [--layer=-1]
      [--head=0] [--output_dir=RUN/visualize] [--step=N]

All logic lives in bipe_jax.evaluation.visualize.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKDIR = flags.DEFINE_string('workdir', '', 'Training workdir.')
_QUERY = flags.DEFINE_integer('query', 0, 'Query position (0-based; 0 = 16x the training '
                              'length - 1, the last token of a 16x window).')
_LAYER = flags.DEFINE_integer('layer', -1, 'Decoder layer (negative: from the last).')
_HEAD = flags.DEFINE_integer('head', 0, 'Attention head of the map.')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', '', 'Where the PNGs and JSON go (default: '
                                  '<workdir>/visualize).')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')


def main(argv):
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()
  from bipe_jax.runs import restore as run_restore  # pylint: disable=g-import-not-at-top
  from bipe_jax.evaluation import visualize  # pylint: disable=g-import-not-at-top
  try:
    doc = visualize.visualize_run(_WORKDIR.value, query=_QUERY.value, layer=_LAYER.value,
                                  head=_HEAD.value, output_dir=_OUTPUT_DIR.value,
                                  step=_STEP.value)
  except (ValueError, FileNotFoundError, run_restore.RunError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'wrote {doc["bias_png"]}, {doc["attention_png"]} and '
        f'{os.path.join(os.path.dirname(doc["bias_png"]), "visualize.json")}')
  return 0


if __name__ == '__main__':
  cli.run(main)
