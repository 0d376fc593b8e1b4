"""Arithmetic chain-of-thought task of the BiPE paper (bipe_jax/tasks/arithmetic.py) on CPU.

The task as Feng et al. (2023) and the BiPE paper define it (docs/arithmetic_task.md):
expressions mod 11 with + - * / and parentheses, one operator evaluated per step, steps
separated by '=' (each step one BiPE segment). Every problem is positioned and attended to as if
alone in its row (positions restart at <bos>, attention is masked across problems).

Training problems have 1..5 operators (more of the longer ones); eval/arithmetic.py measures the
exact-match accuracy of the final answer for 1..5 (held-out problems) and 6..8 operators.
The model is Feng et al.'s width (256, 4 heads) with 3 layers; the paper varies the depth
(bipe_jax/evaluation/arithmetic_sweep.py runs that experiment).

The encoding is the config argument (default bipe_rope):
  python train/main.py --config=configs/arithmetic_tiny.py:rope --workdir=runs/arith_rope
"""

from configs import base


def get_config(encoding: str = 'bipe_rope'):
  config = base.get_base_config()
  m = config.model
  m.position_encoding = encoding or 'bipe_rope'
  m.vocab_size = 21  # the task's vocabulary (tasks/arithmetic.py VOCAB), as Feng et al.'s 21
  m.hidden_size = 256
  m.num_layers = 3
  m.num_heads = 4
  m.ffn_size = 512
  m.max_intra = 64  # a step has at most 4 * 8 + 2 = 34 tokens at 8 operators
  m.max_position = 512
  m.separators = 'auto'  # the tokenizer's step separator '='
  m.restart_at_documents = True  # positions restart at every problem's <bos>
  m.mask_across_documents = True  # a problem never attends to the one packed before it
  m.block_size = 64
  d = config.data
  d.dataset = 'arithmetic'
  d.seq_len = 128
  d.seed = 0
  d.arithmetic_modulus = 11
  d.arithmetic_train_min_ops = 1
  d.arithmetic_train_max_ops = 5
  d.arithmetic_eval_max_ops = 8
  t = config.train
  t.steps = 3000
  t.batch_size = 32
  t.loss_chunk_tokens = 512  # fastest on the project's CPU (configs/tiny.py)
  t.learning_rate = 1e-3
  t.warmup_steps = 200
  t.weight_decay = 0.01
  t.log_every = 50
  config.checkpoint.every_steps = 500
  return config
