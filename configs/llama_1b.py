"""A ~1.2B Llama-style model for TPU slices: 24 layers, width 2048, 16 heads of 128 with 4 KV
heads (grouped-query), SwiGLU FFN 5632, bfloat16 compute with float32 parameters and optimizer
state, parameters and optimizer state sharded over every chip (fsdp), scanned layers, remat.

  --config=configs/llama_1b.py                    bipe_rope at 4,096 tokens
  --config=configs/llama_1b.py:rope,32768         another encoding and / or length

Every length keeps 2^19 tokens (512k) per step: batch 128 x 4,096, 16 x 32,768 (the batch must
divide by the chips: 16 on v5e:4x4). The remat policy and slice come from compiling the step
for TPU on a CPU host (train/compile.py; figures in docs/accelerators.md).
"""

from configs import base

TOKENS_PER_STEP = 2 ** 19


def get_config(arg: str = 'bipe_rope'):
  encoding, _, length = arg.partition(',')
  try:
    seq_len = int(length or 4096)
  except ValueError:
    raise ValueError(f'configs/llama_1b.py:{arg}: expected ENCODING or ENCODING,LENGTH '
                     '(e.g. bipe_rope,32768)') from None
  config = base.get_base_config()
  m = config.model
  m.position_encoding = encoding
  m.vocab_size = 32000
  m.hidden_size = 2048
  m.num_layers = 24
  m.num_heads = 16
  m.num_kv_heads = 4
  m.ffn_size = 5632
  m.max_intra = 1024  # segments (sentences) are far shorter than the rows
  m.max_position = seq_len
  m.separators = 'auto'
  m.block_size = 512
  m.dtype = 'bfloat16'  # compute; parameters and optimizer state stay float32
  m.scan_layers = True
  m.remat = 'full'
  config.data.dataset = 'pg19'
  config.data.seq_len = seq_len
  config.data.tokenizer_vocab_size = 32000
  config.mesh.data = 1
  config.mesh.fsdp = -1  # every chip
  t = config.train
  t.batch_size = max(1, TOKENS_PER_STEP // seq_len)
  t.learning_rate = 3e-4
  t.warmup_steps = 2000
  t.schedule = 'cosine'
  t.end_learning_rate_ratio = 0.1
  t.weight_decay = 0.1
  t.b1 = 0.9
  t.b2 = 0.95
  t.steps = 100000
  t.loss_chunk_tokens = 2048
  config.checkpoint.every_steps = 1000
  return config
