"""Arithmetic chain-of-thought task (bipe_jax/tasks/arithmetic.py) on 2 CPU cores in minutes.

Problems mod 7 with 1..5 operators for training; evaluation (eval/arithmetic.py) measures the
exact-match accuracy of the final answer for 1..5 (held-out) and 6..8 operators (longer than
any training problem). The step separator '=' ends every step, so each step is a segment.

The encoding is the config argument (default bipe_rope):
  python train/main.py --config=configs/arithmetic_tiny.py:rope --workdir=runs/arith_rope
"""

from configs import base


def get_config(encoding: str = 'bipe_rope'):
  config = base.get_base_config()
  m = config.model
  m.position_encoding = encoding or 'bipe_rope'
  m.vocab_size = 19  # the task's character vocabulary (tasks/arithmetic.py VOCAB)
  m.hidden_size = 128
  m.num_layers = 3
  m.num_heads = 4
  m.ffn_size = 384
  m.max_intra = 64  # a step is at most ~30 characters
  m.max_position = 512
  m.rope_original_length = 128
  m.separators = 'auto'  # the tokenizer's step separator '='
  m.attention_impl = 'blockwise'
  m.block_size = 64
  d = config.data
  d.dataset = 'arithmetic'
  d.seq_len = 128
  d.seed = 0
  d.arithmetic_modulus = 7
  d.arithmetic_train_min_ops = 1
  d.arithmetic_train_max_ops = 5
  d.arithmetic_eval_max_ops = 8
  t = config.train
  t.steps = 1200
  t.batch_size = 32
  t.learning_rate = 2e-3
  t.warmup_steps = 100
  t.weight_decay = 0.01
  t.log_every = 50
  config.checkpoint.every_steps = 400
  return config
