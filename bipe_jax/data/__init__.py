"""Data: TFDS datasets (array_record), SentencePiece tokenizers, grain pipelines.

Entry points (the trainer and the evaluator call these):
  prepare(data_config)             build the embedded corpus / text folder and its tokenizer
  get_tokenizer(data_config)       -> Tokenizer (encode, decode, vocab_size, bos_id, eos_id,
                                      separator_ids(rule), path)
  make_train_iterator(data_config, batch_size_per_process, process_index, process_count)
                                   -> grain iterator of {'tokens', 'document_ids'?} [b, seq_len]
  make_eval_blocks(data_config, length, split, max_tokens, stride)
                                   -> (tokens [N, length] int32, target_mask [N, length] bool)
  check_vocab_size(tokenizer, model_vocab_size)   clear error on a mismatch
"""

from bipe_jax.data.pipeline import cut_blocks
from bipe_jax.data.pipeline import eval_stream
from bipe_jax.data.pipeline import make_eval_blocks
from bipe_jax.data.pipeline import make_train_dataset
from bipe_jax.data.pipeline import make_train_iterator
from bipe_jax.data.preparation import get_tokenizer
from bipe_jax.data.preparation import prepare
from bipe_jax.data.preparation import tokenizer_path
from bipe_jax.data.tokenizer import OFFICIAL_SEPARATOR_IDS
from bipe_jax.data.tokenizer import SEPARATOR_RULES
from bipe_jax.data.tokenizer import Tokenizer
from bipe_jax.data.tokenizer import check_vocab_size
from bipe_jax.data.tokenizer import train_tokenizer
