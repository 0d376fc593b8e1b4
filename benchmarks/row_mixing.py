"""Benchmark: how many documents one training batch draws from, with and without row mixing.

  .venv/bin/python benchmarks/row_mixing.py [--data_dir=data_cache] [--windows=0,4096]
      [--batches=100] [--owner_rows=0]

For each training length and `data.shuffle_window`, counts the distinct documents behind the
rows of 100 batches of 32 (`--batches`; each row is attributed to the document holding its
first token, found by matching it against one in-order epoch), the time to the first batch,
and rows/s over twice as many batches again.
This is the measurement behind the choice of a window shuffle after packing
(bipe_jax/data/packing.py). Prints one line per setting.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import base  # pylint: disable=wrong-import-position
import bipe_jax.data as data_lib  # pylint: disable=wrong-import-position

BOS = 1


def row_owners(data_dir: str, seq_len: int, max_rows: int = 0) -> dict[bytes, int]:
  """{row bytes: document index} over one epoch of rows in packing order (its first `max_rows`
  rows when > 0)."""
  c = base.data_defaults()
  c.data_dir, c.seq_len, c.num_epochs, c.shuffle_window = data_dir, seq_len, 1, 0
  owner, doc = {}, -1
  for batch in data_lib.make_train_iterator(c, 1):
    row = batch['tokens'][0]
    if row[0] == BOS:
      doc += 1
    owner[row.tobytes()] = max(doc, 0)
    doc += int(np.sum(row[1:] == BOS))
    if max_rows and len(owner) >= max_rows:
      break
  return owner


def measure(data_dir: str, seq_len: int, window: int, owner: dict, batches: int = 100) -> str:
  c = base.data_defaults()
  c.data_dir, c.seq_len, c.shuffle_window = data_dir, seq_len, window
  start = time.perf_counter()
  it = data_lib.make_train_iterator(c, 32)
  first = next(it)
  first_seconds = time.perf_counter() - start
  rows = [r.tobytes() for b in [first] + [next(it) for _ in range(batches - 1)]
          for r in b['tokens']]
  if any(r not in owner for r in rows):
    raise SystemExit(f'row_mixing: a row of seq_len {seq_len}, shuffle_window {window} is not '
                     'among the attributed rows; raise --owner_rows (0: the whole epoch)')
  counts = [len({owner[r] for r in rows[i:i + 32]}) for i in range(0, len(rows), 32)]
  start = time.perf_counter()
  for _ in range(2 * batches):  # the rate: twice as many batches again
    next(it)
  rate = 2 * batches * 32 / (time.perf_counter() - start)
  return (f'seq_len {seq_len}, shuffle_window {window}: first batch after {first_seconds:.2f} s; '
          f'documents per batch mean {np.mean(counts):.1f} (min {min(counts)}, max '
          f'{max(counts)}); {rate:,.0f} rows/s')


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--data_dir', default='data_cache')
  p.add_argument('--seq_lens', default='64,128')
  p.add_argument('--windows', default='0,4096')
  p.add_argument('--batches', type=int, default=100, help='batches of 32 rows counted')
  p.add_argument('--owner_rows', type=int, default=0,
                 help='attribute only the first N rows of the epoch (0: all; enough for '
                      '--windows=0 and N >= 32 * batches)')
  args = p.parse_args(argv)
  data_lib.prepare(_data_config(args.data_dir))
  print(f'load average before: {os.getloadavg()[0]:.2f}')
  for seq_len in (int(x) for x in args.seq_lens.split(',')):
    owner = row_owners(args.data_dir, seq_len, args.owner_rows)
    for window in (int(x) for x in args.windows.split(',')):
      print(measure(args.data_dir, seq_len, window, owner, args.batches), flush=True)
  print(f'load average after: {os.getloadavg()[0]:.2f}')


def _data_config(data_dir: str):
  c = base.data_defaults()
  c.data_dir = data_dir
  return c


if __name__ == '__main__':
  main()
