"""The BiPE paper's ~155M models (hidden 768, 12 layers, 12 heads, FFN 3072), one preset for the
four encodings it compares: `--config=configs/paper_151m.py:ENCODING` with ENCODING one of
rope, bipe_rope (default), alibi, bipe_alibi (BiPE-ALiBi: ALiBi slopes x96 on segment ids).

Accelerator settings from compiling the step for a TPU v5e-8 (train/compile.py,
docs/accelerators.md): scanned layers (the TPU compiler takes one layer body instead of twelve;
unrolled, the step did not finish compiling in 10 minutes on the project's CPU host) and
`model.remat='full'`: at the paper's batch (256 x 1024, 32 rows per chip) the float32 step
needs 27.9 GiB per chip without remat, 19.6 GiB saving the projections, 8.1 GiB with full
remat, of 16 GiB. The other settings are the paper's (PG19, 1024 tokens, batch 256).
"""

from configs import base

ENCODINGS = ('rope', 'bipe_rope', 'alibi', 'bipe_alibi')


def get_config(encoding: str = 'bipe_rope'):
  if encoding not in ENCODINGS:
    raise ValueError(f'configs/paper_151m.py:{encoding} is not a preset: choose one of '
                     f'{", ".join(ENCODINGS)}')
  config = base.get_base_config()
  m = config.model
  m.position_encoding = encoding
  m.vocab_size = 32000  # the data's tokenizer (data.tokenizer_vocab_size), as the Llama one
  m.hidden_size = 768
  m.num_layers = 12
  m.num_heads = 12
  m.ffn_size = 3072
  m.max_intra = 1024
  m.max_position = 1024
  m.separators = 'auto'  # by the data's tokenizer ('official' {869, 13}: Llama tokenizer only)
  m.block_size = 256
  m.scan_layers = True
  m.remat = 'full'
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
