"""BiPE-RoPE as in the paper, ~155M (hidden 768, 12 layers, 12 heads, FFN 3072)."""

from configs import base


def get_config():
  config = base.get_base_config()
  m = config.model
  m.position_encoding = 'bipe_rope'
  m.vocab_size = 32000  # the data's tokenizer (data.tokenizer_vocab_size), as the Llama one
  m.hidden_size = 768
  m.num_layers = 12
  m.num_heads = 12
  m.ffn_size = 3072
  m.max_intra = 1024
  m.max_position = 1024
  m.separators = 'auto'  # by the data's tokenizer ('official' {869, 13}: Llama tokenizer only)
  m.block_size = 256
  config.data.dataset = 'pg19'
  config.data.seq_len = 1024
  config.data.tokenizer_vocab_size = 32000
  t = config.train
  t.batch_size = 256
  t.learning_rate = 1e-4
  t.warmup_steps = 10000
  t.schedule = 'linear'
  t.weight_decay = 0.01
  t.b1 = 0.9
  t.b2 = 0.98
  t.steps = 490000
  config.checkpoint.every_steps = 5000
  return config
