"""Trains a SentencePiece tokenizer on the train split of any dataset (built or prepared).

  python train/train_tokenizer.py --dataset=embedded --model_type=unigram --vocab_size=8192
  python train/train_tokenizer.py --dataset=pg19 --data_dir=/data/tfds --output=/tmp/pg19.model

Without --output the model is written beside the data (where data.tokenizer_path='' finds it
for the same model type and vocab size). Newlines stay single pieces, text is kept byte-exact
(identity normalisation, no whitespace folding, byte fallback).
"""

import json
import os
import sys
import time

from bipe_jax import cli
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import base  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.data import preparation as prepare_lib  # pylint: disable=wrong-import-position
from bipe_jax.data import tfds_builders  # pylint: disable=wrong-import-position
from bipe_jax.data import tokenizer as tokenizer_lib  # pylint: disable=wrong-import-position

_D = base.data_defaults()
DATASET = flags.DEFINE_enum('dataset', _D.dataset, list(tfds_builders.DATASETS), 'Dataset.')
DATA_DIR = flags.DEFINE_string('data_dir', _D.data_dir, 'TFDS data_dir.')
TEXT_DIR = flags.DEFINE_string('text_dir', _D.text_dir, 'Folder of text for text_folder.')
TEXT_FIELD = flags.DEFINE_string('text_field', _D.text_field, 'Text field of .jsonl lines.')
VALIDATION_FRACTION = flags.DEFINE_float('validation_fraction', _D.validation_fraction,
                                         'Fraction of documents held out for validation.')
MODEL_TYPE = flags.DEFINE_enum('model_type', 'bpe', list(tokenizer_lib.MODEL_TYPES),
                               'SentencePiece model type.')
VOCAB_SIZE = flags.DEFINE_integer('vocab_size', _D.tokenizer_vocab_size, 'Vocabulary size.')
MAX_CHARACTERS = flags.DEFINE_integer('max_characters', 50_000_000,
                                      'Train on at most this many characters of the split.')
OUTPUT = flags.DEFINE_string('output', '', 'Model path ('' = beside the data).')


def main(argv):
  del argv
  c = base.data_defaults()
  c.dataset, c.data_dir, c.text_dir = DATASET.value, DATA_DIR.value, TEXT_DIR.value
  c.text_field, c.validation_fraction = TEXT_FIELD.value, VALIDATION_FRACTION.value
  c.tokenizer_model_type, c.tokenizer_vocab_size = MODEL_TYPE.value, VOCAB_SIZE.value
  start = time.perf_counter()
  try:
    if c.dataset in ('embedded', 'text_folder'):
      tfds_builders.build(c)  # idempotent
    path = OUTPUT.value or prepare_lib.default_tokenizer_path(c)
    tok = tokenizer_lib.train_tokenizer(
        prepare_lib.iter_split_texts(c, 'train'), path, model_type=MODEL_TYPE.value,
        vocab_size=VOCAB_SIZE.value, max_characters=MAX_CHARACTERS.value)
  except ValueError as e:
    sys.exit(f'error: {e}')
  print(json.dumps({'tokenizer': tok.path, 'vocab_size': tok.vocab_size,
                    'separators_auto': len(tok.separator_ids('auto')),
                    'separators_newline': len(tok.separator_ids('newline')),
                    'seconds': round(time.perf_counter() - start, 2)}, indent=2))


if __name__ == '__main__':
  cli.run(main)
