"""Synthetic passkey retrieval (bipe_jax/tasks/passkey.py) on CPU: trained at 64 tokens, probed
up to 8x that with eval/passkey.py.

Every row is one sample: filler sentences (each a BiPE segment, ended by '.'), the key sentence
`KEY IS d d d d d .` at a random depth, then `? ANS` and the key. The model is the tiny preset's
(4 layers, width 128, 4 heads) with the task's 34-token vocabulary.

The encoding is the config argument (default bipe_rope):
  python train/main.py --config=configs/passkey_tiny.py:rope --workdir=runs/pk_rope
"""

from configs import base


def get_config(encoding: str = 'bipe_rope'):
  config = base.get_base_config()
  m = config.model
  m.position_encoding = encoding or 'bipe_rope'
  m.vocab_size = 34  # tasks/passkey.py VOCAB
  m.hidden_size = 128
  m.num_layers = 4
  m.num_heads = 4
  m.ffn_size = 512
  m.max_intra = 64  # a sentence has at most 9 tokens
  m.max_position = 1024
  m.separators = 'auto'  # the task's '.'
  m.block_size = 64
  d = config.data
  d.dataset = 'passkey'
  d.seq_len = 64
  d.seed = 0
  t = config.train
  t.steps = 2000
  t.batch_size = 32
  t.loss_chunk_tokens = 512  # fastest on the project's CPU (configs/tiny.py)
  t.learning_rate = 2e-3
  t.warmup_steps = 200
  t.schedule = 'cosine'
  t.log_every = 100
  config.checkpoint.every_steps = 500
  return config
