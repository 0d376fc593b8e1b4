"""Tiny preset: trains at a useful speed on 2 CPU cores (embedded corpus, length 128)."""

from configs import base


def get_config():
  config = base.get_base_config()
  config.model.position_encoding = 'bipe_rope'
  config.model.vocab_size = 4096
  config.model.hidden_size = 128
  config.model.num_layers = 4
  config.model.num_heads = 4
  config.model.ffn_size = 512
  config.model.max_intra = 128
  config.model.max_position = 128
  config.model.block_size = 128
  config.data.seq_len = 128
  # Measured on the project's 2-core CPU: the chunk size the loss runs fastest at there, two
  # tokenisation threads (more only contend with the step for the cores), and a vocabulary the
  # embedded corpus trains a tokenizer of in seconds (train/build_data.py's default).
  config.train.loss_chunk_tokens = 512
  config.data.num_threads = 2
  config.data.tokenizer_vocab_size = 4096
  config.train.steps = 600
  config.train.batch_size = 32
  config.train.learning_rate = 2e-3
  config.train.warmup_steps = 60
  config.checkpoint.every_steps = 200
  return config
