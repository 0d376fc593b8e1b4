"""Token counts of a built dataset's splits, tokenised on several threads without keeping the ids.

`train/build_data.py --count_tokens` prints them. The evaluation stream (pipeline.eval_stream)
keeps every id of a split in memory, which a validation split affords and the Pile's training
split (hundreds of billions of tokens) does not; here documents go to SentencePiece's own thread
pool in batches and only their lengths are summed.
"""

from typing import Iterable, Iterator

from bipe_jax.data import preparation

BATCH_DOCUMENTS = 256


def count_tokens(data_config, split: str, num_threads: int,
                 batch_documents: int = BATCH_DOCUMENTS) -> int:
  """Tokens of `split` as the pipelines see them: per document BOS + its ids, summed.

  `num_threads` SentencePiece threads per batch of `batch_documents` documents (0 or 1: one).
  """
  tok = preparation.get_tokenizer(data_config)
  threads = max(1, int(num_threads))
  return sum(len(ids) + 1
             for batch in _batches(preparation.iter_split_texts(data_config, split),
                                   batch_documents)
             for ids in tok.encode(batch, num_threads=threads))


def _batches(items: Iterable, size: int) -> Iterator[list]:
  batch = []
  for item in items:
    batch.append(item)
    if len(batch) == size:
      yield batch
      batch = []
  if batch:
    yield batch
