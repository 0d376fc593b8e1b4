"""Score a SCROLLS fine-tune (configs/scrolls_finetune.py) on a split with the subset's metric.

  python eval/scrolls.py --workdir=runs/tiny_qasper --split=validation --max_examples=200 \
      --output=qasper.json

Greedy answers (prompts left-padded into batches), then exact match (quality, contract_nli),
token F1 (qasper, narrative_qa) or the ROUGE-1/2/L geometric mean (gov_report, summ_screen_fd,
qmsum). All logic lives in bipe_jax.evaluation.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKDIR = flags.DEFINE_string('workdir', None, 'The fine-tuned workdir.')
_SPLIT = flags.DEFINE_string('split', 'validation', 'Split to answer.')
_MAX_EXAMPLES = flags.DEFINE_integer('max_examples', 0, 'First N ids only (0 = all).')
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Longest answer (tokens).')
_BATCH = flags.DEFINE_integer('batch_size', 8, 'Prompts decoded together.')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
_OUTPUT = flags.DEFINE_string('output', '', 'JSON results file ("" = none).')
flags.mark_flag_as_required('workdir')


def main(argv):
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()  # a CPU run's set-up (freed memory kept), before JAX starts
  from bipe_jax.evaluation import cli as eval_cli  # pylint: disable=g-import-not-at-top
  return eval_cli.scrolls_main(
      workdir=_WORKDIR.value, split=_SPLIT.value, max_examples=_MAX_EXAMPLES.value,
      max_new_tokens=_MAX_NEW.value, batch_size=_BATCH.value, step=_STEP.value,
      output=_OUTPUT.value, command=' '.join(['python eval/scrolls.py'] + sys.argv[1:]))


if __name__ == '__main__':
  cli.run(main)
