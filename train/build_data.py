"""Builds a dataset as TFDS array_record in --data_dir and trains its SentencePiece tokenizer.

  python train/build_data.py                        # the embedded corpus into ./data_cache
  python train/build_data.py --dataset=text_folder --text_dir=/path/to/texts
  python train/build_data.py --dataset=pg19 --data_dir=/data/tfds   # tokenizer for a prepared pg19

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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import base  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax import data as data_lib  # pylint: disable=wrong-import-position
from bipe_jax.data import build_summary  # pylint: disable=wrong-import-position
from bipe_jax.data import tfds_builders  # pylint: disable=wrong-import-position

_D = base.data_defaults()
DATASET = flags.DEFINE_enum('dataset', _D.dataset, list(tfds_builders.DATASETS),
                            'Which dataset to build (pg19 / arxiv must be prepared with tfds).')
DATA_DIR = flags.DEFINE_string('data_dir', _D.data_dir, 'TFDS data_dir.')
TEXT_DIR = flags.DEFINE_string('text_dir', _D.text_dir, 'Folder of text for text_folder.')
TEXT_FIELD = flags.DEFINE_string('text_field', _D.text_field, 'Text field of .jsonl lines.')
VALIDATION_FRACTION = flags.DEFINE_float('validation_fraction', _D.validation_fraction,
                                         'Fraction of documents held out for validation.')
MODEL_TYPE = flags.DEFINE_enum('model_type', _D.tokenizer_model_type, ['bpe', 'unigram'],
                               'SentencePiece model type.')
VOCAB_SIZE = flags.DEFINE_integer('vocab_size', _D.tokenizer_vocab_size, 'Tokenizer vocab size.')
TOKENIZER_PATH = flags.DEFINE_string('tokenizer_path', '',
                                     'Use this existing tokenizer instead of training one.')
FORCE = flags.DEFINE_bool('force', False, 'Rebuild the dataset and retrain the tokenizer.')
COUNT_TOKENS = flags.DEFINE_bool('count_tokens', True, 'Tokenise both splits and print sizes.')
JSON = flags.DEFINE_bool('json', False, 'Print the whole record (build report included) as JSON.')


def data_config_from_flags():
  c = base.data_defaults()
  c.dataset = DATASET.value
  c.data_dir = DATA_DIR.value
  c.text_dir = TEXT_DIR.value
  c.text_field = TEXT_FIELD.value
  c.validation_fraction = VALIDATION_FRACTION.value
  c.tokenizer_model_type = MODEL_TYPE.value
  c.tokenizer_vocab_size = VOCAB_SIZE.value
  c.tokenizer_path = TOKENIZER_PATH.value
  return c


def main(argv):
  del argv
  config = data_config_from_flags()
  start = time.perf_counter()
  try:
    prepared = data_lib.prepare(config, force=FORCE.value)
  except ValueError as e:
    sys.exit(f'error: {e}')
  summary = {'dataset': config.dataset, 'version_dir': prepared.version_dir,
             'tokenizer': prepared.tokenizer_path, 'built': prepared.built,
             'trained_tokenizer': prepared.trained_tokenizer,
             'prepare_seconds': round(prepared.seconds, 2)}
  report = tfds_builders.read_report(config)
  if report:
    summary['report'] = report
  if COUNT_TOKENS.value:
    tok = data_lib.get_tokenizer(config)
    for split in ('train', 'validation'):
      summary[f'{split}_tokens'] = int(len(data_lib.eval_stream(config, split)))
    summary['vocab_size'] = tok.vocab_size
    summary['separators_auto'] = len(tok.separator_ids('auto'))
  summary['wall_seconds'] = round(time.perf_counter() - start, 2)
  print(json.dumps(summary, indent=2) if JSON.value else build_summary.format_summary(summary))


if __name__ == '__main__':
  cli.run(main)
