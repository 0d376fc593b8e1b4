"""Grain pipelines: packed training rows and evaluation blocks.

Training (`make_train_iterator`): the train split's documents, this process's share
(`[process_index::process_count]`, so processes never overlap), shuffled with `data.seed`
(reshuffled every epoch, repeated forever unless `data.num_epochs` > 0), tokenised with BOS per
document on `data.num_threads` threads, packed concatenate-and-split into rows of `data.seq_len`
(optionally with document ids), the rows mixed across documents in windows of
`data.shuffle_window` rows (see bipe_jax/data/packing.py: without it a batch is one or two
documents), batched, prefetched. Deterministic for a seed; its iterator has
get_state()/set_state() (JSON-able dicts) and grain's Orbax save/load.

Evaluation (`make_eval_blocks`): the official protocol. The split's documents in stored order,
each with BOS, concatenated into one stream (cut once at `max_tokens`, so every length scores
the same stream) and cut into non-overlapping blocks of `length`; or sliding windows with a
`stride` where only each window's last `stride` tokens are scored.
"""

import logging
import threading

import grain
import numpy as np

from bipe_jax import storage
from bipe_jax.data import generated
from bipe_jax.data import packing
from bipe_jax.data import preparation as prepare_lib
from bipe_jax.data import tfds_builders


def _check_int(name: str, value, minimum: int) -> int:
  if isinstance(value, bool) or int(value) != value or value < minimum:
    raise ValueError(f'{name} must be an integer >= {minimum}, got {value!r}')
  return int(value)


def _tokenize_fn(tok, feature: str):
  def tokenize(example) -> np.ndarray:
    text = example[feature]
    text = text.decode('utf-8', 'replace') if isinstance(text, bytes) else str(text)
    return tok.encode_document(text)
  return tokenize


def make_train_dataset(data_config, batch_size_per_process: int, process_index: int = 0,
                       process_count: int = 1) -> grain.IterDataset:
  """The training pipeline as a grain IterDataset (see `make_train_iterator`)."""
  batch = _check_int('batch_size_per_process', batch_size_per_process, 1)
  count = _check_int('process_count', process_count, 1)
  index = _check_int('process_index', process_index, 0)
  if index >= count:
    raise ValueError(f'process_index={index} must be < process_count={count}')
  seq_len = _check_int('data.seq_len', data_config.seq_len, 2)
  epochs = _check_int('data.num_epochs', data_config.num_epochs, 0)
  threads = _check_int('data.num_threads', data_config.num_threads, 0)
  prefetch = _check_int('data.prefetch', data_config.prefetch, 0)
  window = _check_int('data.shuffle_window', data_config.shuffle_window, 0)
  tok = prepare_lib.get_tokenizer(data_config)
  source, feature = tfds_builders.open_split(data_config, 'train')
  if len(source) < count:
    raise ValueError(f'the train split of {data_config.dataset!r} has {len(source)} documents, '
                     f'fewer than process_count={count}: every process needs at least one')
  ds = grain.MapDataset.source(source)[index::count]
  ds = ds.shuffle(seed=int(data_config.seed))
  ds = ds.repeat(epochs if epochs else None, reseed_each_epoch=True)
  ds = ds.map(_tokenize_fn(tok, feature))
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads,
                                            prefetch_buffer_size=max(4 * threads, 1)))
  # Document ids per row are for library users of this pipeline; the trainer's model derives
  # documents from the BOS tokens themselves (model.restart_at_documents, mask_across_documents).
  ds = packing.pack_rows(ds, seq_len, bool(data_config.get('document_ids', False)))
  ds = packing.mix_rows(ds, window, seed=int(data_config.seed))
  ds = ds.batch(batch, drop_remainder=True)
  if prefetch:
    ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)
  return ds


def make_train_iterator(data_config, batch_size_per_process: int, process_index: int = 0,
                        process_count: int = 1):
  """A grain DatasetIterator of {'tokens': int32 [b, seq_len], 'document_ids'?: int32 [b, seq_len]}.

  `get_state()` / `set_state(state)` resume exactly; grain's Orbax checkpoint handler works too.
  """
  task = generated.lookup(data_config.dataset)
  if task is not None:
    return task.make_train_iterator(
        data_config, batch_size_per_process, process_index, process_count)
  return iter(make_train_dataset(data_config, batch_size_per_process, process_index,
                                 process_count))


# ---------------------------------------------------------------- evaluation

_STREAMS: dict = {}
_STREAMS_LOCK = threading.Lock()


def eval_stream(data_config, split: str = 'validation') -> np.ndarray:
  """int32 [n]: the split's documents in stored order, each BOS + ids, concatenated (cached)."""
  vdir = tfds_builders.version_dir(data_config)
  tok = prepare_lib.get_tokenizer(data_config)
  key = (vdir, tok.path, storage.mtime(tok.path), split)
  with _STREAMS_LOCK:
    if key not in _STREAMS:
      source, feature = tfds_builders.open_split(data_config, split)
      fn = _tokenize_fn(tok, feature)
      docs = [fn(source[i]) for i in range(len(source))]
      _STREAMS[key] = np.concatenate(docs) if docs else np.zeros(0, np.int32)
    return _STREAMS[key]


def cut_blocks(stream, length: int, stride: int | None = None, *, what: str = 'the stream'):
  """(tokens [N, length] int32, target_mask [N, length] bool) from a 1-D token stream.

  `target_mask[n, t]` says whether token t is scored as a target (predicted from the logits at
  t - 1); column 0 is never a target. Without `stride`: non-overlapping blocks, every target
  scored, the tail shorter than a block dropped. With `stride`: windows starting every
  `stride` tokens, only their last `stride` tokens scored (so each token is scored at most once,
  always with at least `length - stride` tokens of context).
  """
  stream = np.asarray(stream, np.int32).reshape(-1)
  length = _check_int('length', length, 2)
  n = len(stream)
  if n < length:
    raise ValueError(f'{what} has {n} tokens, fewer than one block of length {length}: use a '
                     'shorter length or a larger split (or a larger max_tokens)')
  if stride is None:
    count = n // length
    tokens = stream[:count * length].reshape(count, length).copy()
    mask = np.ones((count, length), bool)
    mask[:, 0] = False
    return tokens, mask
  stride = _check_int('stride', stride, 1)
  if stride > length:
    raise ValueError(f'stride={stride} must be <= length={length}')
  windows = np.lib.stride_tricks.sliding_window_view(stream, length)[::stride]
  tokens = np.ascontiguousarray(windows)
  mask = np.zeros(tokens.shape, bool)
  mask[:, max(1, length - stride):] = True
  return tokens, mask


def make_eval_blocks(data_config, length: int, split: str = 'validation',
                     max_tokens: int | None = None, stride: int | None = None):
  """Evaluation blocks of `length` from one split: (tokens [N, length] int32, mask [N, length]).

  The same stream (capped at `max_tokens` once) serves every length. See `cut_blocks`.
  """
  task = generated.lookup(data_config.dataset)
  if task is not None:
    return task.make_eval_blocks(
        data_config, length, split=split, max_tokens=max_tokens, stride=stride)
  stream = eval_stream(data_config, split)
  what = f'the {split!r} split of {data_config.dataset!r}'
  if max_tokens is not None:
    max_tokens = _check_int('max_tokens', max_tokens, 1)
    if max_tokens < len(stream):
      stream = stream[:max_tokens]
      what += f' capped at max_tokens={max_tokens}'
  tokens, mask = cut_blocks(stream, length, stride, what=what)
  dropped = len(stream) - (tokens.shape[0] * length if stride is None else 0)
  if stride is None and dropped:
    logging.info('%s: %d tail tokens shorter than length %d are not scored', what, dropped,
                 length)
  return tokens, mask
