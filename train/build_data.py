"""Builds a dataset as TFDS array_record in --data_dir and trains its SentencePiece tokenizer.

  python train/build_data.py                        # the embedded corpus into ./data_cache
  python train/build_data.py --dataset=text_folder --text_dir=/path/to/texts
  python train/build_data.py --dataset=pg19 --data_dir=/data/tfds   # tokenizer for a prepared pg19
  python train/build_data.py --config=configs/paper_151m.py --pile_dir=/data/pile --data_dir=...

The defaults are the data section of --config (configs/tiny.py, the CPU preset: a 4096-piece
tokenizer; a paper preset gives the Pile and 32000); each flag given overrides its field.

Idempotent: what exists is reused (--force rebuilds). Prints the dataset, the tokenizer, the
corpus size in tokens and the wall time in a few lines (--json: the whole record with the build
report).
"""

import json
import os
import sys
import time

from bipe_jax import cli
from absl import flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import tiny  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax import data as data_lib  # pylint: disable=wrong-import-position
from bipe_jax.data import build_summary  # pylint: disable=wrong-import-position
from bipe_jax.data import pile  # pylint: disable=wrong-import-position
from bipe_jax.data import token_count  # pylint: disable=wrong-import-position
from bipe_jax.data import tfds_builders  # pylint: disable=wrong-import-position

_D = tiny.get_config().data
_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'A preset whose data section gives the defaults (default: configs/tiny.py).')
DATASET = flags.DEFINE_enum('dataset', _D.dataset, list(tfds_builders.DATASETS),
                            'Which dataset to build (pg19 / arxiv must be prepared with tfds).')
DATA_DIR = flags.DEFINE_string('data_dir', _D.data_dir, 'TFDS data_dir.')
TEXT_DIR = flags.DEFINE_string('text_dir', _D.text_dir, 'Folder of text for text_folder.')
TEXT_FIELD = flags.DEFINE_string('text_field', _D.text_field, 'Text field of .jsonl lines.')
PILE_DIR = flags.DEFINE_string('pile_dir', _D.pile_dir, "Folder of the Pile's .jsonl(.zst) "
                               'files for --dataset=pile.')
PILE_SUBSETS = flags.DEFINE_string('pile_subsets', _D.pile_subsets, 'meta.pile_set_name '
                                   "subsets kept, comma-separated ('' = all; pg19, arxiv, github).")
PILE_SPLITS = flags.DEFINE_string('pile_splits', _D.pile_splits, 'Splits of the Pile folder to '
                                  'build (train, validation, test).')
VALIDATION_FRACTION = flags.DEFINE_float('validation_fraction', _D.validation_fraction,
                                         'Fraction of documents held out for validation.')
MODEL_TYPE = flags.DEFINE_enum('model_type', _D.tokenizer_model_type, ['bpe', 'unigram'],
                               'SentencePiece model type.')
VOCAB_SIZE = flags.DEFINE_integer('vocab_size', _D.tokenizer_vocab_size, 'Tokenizer vocab size.')
TOKENIZER_PATH = flags.DEFINE_string('tokenizer_path', '',
                                     'Use this existing tokenizer instead of training one.')
FORCE = flags.DEFINE_bool('force', False, 'Rebuild the dataset and retrain the tokenizer.')
COUNT_TOKENS = flags.DEFINE_bool('count_tokens', True, 'Tokenise the splits (on data.num_threads '
                                  'threads) and print their sizes in tokens.')
JSON = flags.DEFINE_bool('json', False, 'Print the whole record (build report included) as JSON.')


# flag name -> data field
_FIELDS = {'dataset': 'dataset', 'data_dir': 'data_dir', 'text_dir': 'text_dir',
           'text_field': 'text_field', 'pile_dir': 'pile_dir', 'pile_subsets': 'pile_subsets',
           'pile_splits': 'pile_splits', 'validation_fraction': 'validation_fraction',
           'model_type': 'tokenizer_model_type', 'vocab_size': 'tokenizer_vocab_size',
           'tokenizer_path': 'tokenizer_path'}


def data_config_from_flags():
  """The --config preset's data section (configs/tiny.py's without it), the flags given on top."""
  c = (_CONFIG.value.data if _CONFIG.value is not None else tiny.get_config().data)
  c = c.copy_and_resolve_references()
  for flag, field in _FIELDS.items():
    if flags.FLAGS[flag].present:
      c[field] = flags.FLAGS[flag].value
  return c


def main(argv):
  del argv
  config = data_config_from_flags()
  start = time.perf_counter()
  try:
    prepared = data_lib.prepare(config, force=FORCE.value)
  except ValueError as e:
    cli.fail(str(e))
  summary = {'dataset': config.dataset, 'version_dir': prepared.version_dir,
             'tokenizer': prepared.tokenizer_path, 'built': prepared.built,
             'trained_tokenizer': prepared.trained_tokenizer,
             'prepare_seconds': round(prepared.seconds, 2)}
  report = tfds_builders.read_report(config)
  if report:
    summary['report'] = report
  if not prepared.tokenizer_path:
    summary['tokenizer'] = '(none: an evaluation set, tokenised with the run\'s own)'
  elif COUNT_TOKENS.value:
    tok = data_lib.get_tokenizer(config)
    splits = (pile.parse_splits(config.pile_splits) if config.dataset == 'pile'
              else ('train', 'validation'))
    for split in splits:
      summary[f'{split}_tokens'] = token_count.count_tokens(config, split,
                                                           int(config.num_threads))
    summary['vocab_size'] = tok.vocab_size
    summary['separators_auto'] = len(tok.separator_ids('auto'))
  summary['wall_seconds'] = round(time.perf_counter() - start, 2)
  print(json.dumps(summary, indent=2) if JSON.value else build_summary.format_summary(summary))


if __name__ == '__main__':
  cli.run(main)
