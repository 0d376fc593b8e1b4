"""Perplexity against evaluation length for one or several training workdirs.

  python eval/perplexity.py --workdir=runs/rope --workdir=runs/bipe_rope \
      --lengths=128,256,512,1024,2048 --output=results.json --plot=ppl.png

Restores the latest (or --step) checkpoint of each workdir, scores the validation split of its
dataset (or --dataset / --data_dir) cut into windows by --protocol: windows (non-overlapping,
every target scored: the official protocol), last:K (non-overlapping, only the last K targets of
each: DAPE's), sliding:STRIDE (windows every STRIDE tokens scoring their last STRIDE), with
blockwise attention so memory grows linearly with length. Prints a table per run and one side by
side; writes JSON and a PNG. --per_position adds the mean loss at each window position to the
JSON and plots it (--position_plot).
All logic lives in bipe_jax.evaluation.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from bipe_jax import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKDIR = flags.DEFINE_multi_string('workdir', [], 'Training workdir (repeatable).')
_LENGTHS = flags.DEFINE_string('lengths', '128,256,512,1024,2048', 'Comma-separated lengths.')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
_DATASET = flags.DEFINE_string('dataset', '', "Evaluate on this data.dataset instead of the run's.")
_DATA_DIR = flags.DEFINE_string('data_dir', '', "data.data_dir override.")
_PILE_SUBSET = flags.DEFINE_string('pile_subset', '', 'dataset=pile: the validation split of '
                                   'this subset alone (pg19, arxiv, github, or a pile_set_name).')
_PILE_DIR = flags.DEFINE_string('pile_dir', '', "dataset=pile: the folder of the Pile's "
                                '.jsonl(.zst) files, local or gs:// (data.pile_dir override; '
                                "default the run's).")
_PROTOCOL = flags.DEFINE_string('protocol', 'windows',
                                'windows (= blocks): non-overlapping, every target (official); '
                                'last:K: only the last K targets of each window; '
                                'sliding:STRIDE: windows every STRIDE tokens, scoring their last '
                                'STRIDE (or sliding with --stride).')
_STRIDE = flags.DEFINE_integer('stride', None, 'Tokens scored per window (--protocol=sliding).')
_PER_POSITION = flags.DEFINE_bool('per_position', False,
                                  'Also score the mean loss at each window position (JSON + '
                                  'plot).')
_POSITION_PLOT = flags.DEFINE_string('position_plot', 'positions.png',
                                     'PNG of loss by position (with --per_position).')
_MAX_TOKENS = flags.DEFINE_integer('max_tokens', None,
                                   'Cap the validation stream (once, same tokens for every length).')
_TOKENS_PER_BATCH = flags.DEFINE_integer('tokens_per_batch', 16384, 'Tokens per forward pass.')
_ATTENTION = flags.DEFINE_enum('attention_impl', 'blockwise', ['blockwise', 'dense'],
                               'Attention path at evaluation (blockwise: linear memory).')
_BLOCK_SIZE = flags.DEFINE_integer('block_size', 0, 'Attention block size (0 = the run\'s).')
_OUTPUT = flags.DEFINE_string(
    'output', 'auto', 'JSON results file ("auto": perplexity.json in the (first) workdir; "" = none).')
_PLOT = flags.DEFINE_string('plot', '', 'PNG plot of perplexity vs length ("" = none).')


def main(argv):
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process()  # a CPU run's set-up (freed memory kept), before JAX starts
  from bipe_jax.evaluation import cli as eval_cli  # pylint: disable=g-import-not-at-top
  return eval_cli.perplexity_main(
      workdirs=_WORKDIR.value, lengths=_LENGTHS.value, step=_STEP.value, dataset=_DATASET.value,
      data_dir=_DATA_DIR.value, pile_subset=_PILE_SUBSET.value,
      pile_dir=_PILE_DIR.value, protocol=_PROTOCOL.value, stride=_STRIDE.value,
      max_tokens=_MAX_TOKENS.value, tokens_per_batch=_TOKENS_PER_BATCH.value,
      attention_impl=_ATTENTION.value, block_size=_BLOCK_SIZE.value, output=_OUTPUT.value,
      plot=_PLOT.value, per_position=_PER_POSITION.value,
      position_plot=_POSITION_PLOT.value if _PER_POSITION.value else '', command=' '.join(['python eval/perplexity.py'] + sys.argv[1:]))


if __name__ == '__main__':
  cli.run(main)
