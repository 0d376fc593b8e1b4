"""Benchmark: building the embedded corpus + tokenizer, and the training pipeline's tokens/s.

  .venv/bin/python benchmarks/data_pipeline.py --data_dir=/tmp/bench_data
      [--seq_lens=128,1024] [--threads=0,1,2] [--notokenize_rate]

Builds from scratch when --fresh (default) so the build time is measured, then times the
training iterator (tokenise + BOS + pack + batch + prefetch) for a few settings: tokens/s of
rows delivered to the caller, after a warm-up of a few batches. Prints JSON.
"""

import json
import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import base  # pylint: disable=wrong-import-position
import bipe_jax.data as data_lib  # pylint: disable=wrong-import-position
from bipe_jax import storage  # pylint: disable=wrong-import-position

DATA_DIR = flags.DEFINE_string('data_dir', '/tmp/bipe_bench_data', 'Where to build the corpus.')
FRESH = flags.DEFINE_bool('fresh', True, 'Delete data_dir first to time the build.')
BATCHES = flags.DEFINE_integer('batches', 300, 'Batches timed per setting.')
BATCH_SIZE = flags.DEFINE_integer('batch_size', 32, 'Rows per batch.')
SEQ_LENS = flags.DEFINE_list('seq_lens', ['128', '1024'], 'Training lengths timed.')
THREADS = flags.DEFINE_list('threads', ['0', '1', '2'], 'data.num_threads values timed.')
TOKENIZE_RATE = flags.DEFINE_bool('tokenize_rate', True, 'Also time tokenising the whole train '
                                  'split on one thread (single_thread_tokenize_tokens_per_s).')


def time_iterator(config, batches, batch_size):
  it = data_lib.make_train_iterator(config, batch_size)
  for _ in range(5):
    next(it)
  start = time.perf_counter()
  tokens = 0
  for _ in range(batches):
    tokens += next(it)['tokens'].size
  seconds = time.perf_counter() - start
  it.close()
  return tokens / seconds


def main(argv):
  del argv
  if FRESH.value and storage.exists(DATA_DIR.value):
    storage.rmtree(DATA_DIR.value)
  config = base.data_defaults()
  config.data_dir = DATA_DIR.value
  start = time.perf_counter()
  prepared = data_lib.prepare(config)
  build_seconds = time.perf_counter() - start
  tok = data_lib.get_tokenizer(config)
  results = {
      'python': sys.version.split()[0], 'cpus': os.cpu_count(),
      'build_and_tokenizer_seconds': round(build_seconds, 2),
      'built': prepared.built, 'vocab_size': tok.vocab_size,
  }
  if TOKENIZE_RATE.value:
    start = time.perf_counter()
    train_tokens = len(data_lib.eval_stream(config, 'train'))
    tokenize_seconds = time.perf_counter() - start
    results.update(train_tokens=train_tokens,
                   validation_tokens=len(data_lib.eval_stream(config, 'validation')),
                   single_thread_tokenize_tokens_per_s=round(train_tokens / tokenize_seconds))
  results['pipeline_tokens_per_s'] = {}
  for seq_len in (int(x) for x in SEQ_LENS.value):
    for threads in (int(x) for x in THREADS.value):
      config.seq_len, config.num_threads = seq_len, threads
      config.document_ids = True
      batches = max(1, BATCHES.value * 128 // seq_len)  # the default: 300 and 37
      tps = time_iterator(config, batches, BATCH_SIZE.value)
      results['pipeline_tokens_per_s'][f'seq_len={seq_len},threads={threads}'] = round(tps)
  print(json.dumps(results, indent=2))


if __name__ == '__main__':
  app.run(main)
