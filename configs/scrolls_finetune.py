"""Fine-tune a trained run on a SCROLLS subset (input -> output, loss on the output only).

The config argument is the run to start from; its model section, tokenizer and parameters are
taken over (train.init_from), the data is SCROLLS (bipe_jax/tasks/scrolls.py):

  python train/main.py --config=configs/scrolls_finetune.py:runs/tiny --workdir=runs/tiny_qasper \
      --config.data.scrolls_subset=qasper --config.data.scrolls_jsonl=/path/to/qasper_jsonl
  python eval/scrolls.py --workdir=runs/tiny_qasper --max_examples=200

Without data.scrolls_jsonl the subset is read from a prepared TFDS data_dir
(`tfds build scrolls/qasper --data_dir=...` on a machine with internet access).
"""

import json
import os

from configs import base


def get_config(source: str = ''):
  config = base.get_base_config()
  if source:
    with open(os.path.join(source, 'config.json'), encoding='utf-8') as f:
      trained = json.load(f)
    for key, value in trained['model'].items():
      config.model[key] = tuple(value) if isinstance(value, list) else value
    config.model.separators = 'ids'  # the source's resolved separators, unchanged
    config.train.init_from = source
    config.data.tokenizer_path = os.path.join(source, 'tokenizer.model')
  d = config.data
  d.dataset = 'scrolls'
  d.scrolls_subset = 'qasper'
  d.scrolls_jsonl = ''
  d.scrolls_truncate = 'end'
  d.scrolls_max_output_tokens = 128
  d.seq_len = 1024
  config.model.rope_original_length = 0  # derived: the source's training length
  config.model.train_length = 0
  t = config.train
  t.steps = 1000
  t.batch_size = 8
  t.learning_rate = 2e-4
  t.warmup_steps = 50
  t.schedule = 'cosine'
  t.log_every = 20
  config.checkpoint.every_steps = 200
  return config
