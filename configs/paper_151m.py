"""The BiPE paper's ~155M models (hidden 768, 12 layers, 12 heads, FFN 3072), one preset for the
four encodings it compares, trained on the Pile:

  --config=configs/paper_151m.py:ENCODING        ENCODING: rope, bipe_rope (default), alibi,
                                                 bipe_alibi (BiPE-ALiBi: ALiBi slopes x96)
  --config=configs/paper_151m.py:ENCODING_llama  the same with the Llama tokenizer and the
                                                 official separators (see below)

Set `--config.data.pile_dir=` to a folder of the Pile's jsonl(.zst) files (bipe_jax/data/pile.py;
docs/tpu.md prepares it once into a bucket). configs/paper_151m_tpu.py is this preset with the
settings a TPU v5e slice needs (bfloat16, remat, data threads).

What it reproduces (the paper, section 4.1, and its official code):
- model: Llama-style decoder, hidden 768, 12 layers, 12 heads (MHA), FFN 3072 SwiGLU, RMSNorm,
  untied embeddings, no dropout, vocabulary 32000; BiPE's learned intra-segment table of 1024
  rows (the training length);
- data: the Pile, every subset (`data.pile_subsets=''`), documents with BOS, packed
  concatenate-and-split into rows of 1024 tokens, rows mixed across the corpus;
- optimisation: AdamW lr 1e-4, betas (0.9, 0.98), weight decay 0.01, 10k warmup steps then
  linear decay, global batch 256 x 1024, 490k steps (128.5B tokens);
- evaluation: the validation split of the Pile's PG-19, ArXiv and Github subsets, each its own
  dataset: `--config.data.pile_subsets=pg19 --config.data.pile_splits=validation`
  (eval/perplexity.py, non-overlapping blocks, every token scored).
- `_llama` variants: the official separators {869 '▁.', 13 '<0x0A>'} of the Llama tokenizer,
  the tokenizer file given by `--config.data.tokenizer_path=/path/to/tokenizer.model` (never
  downloaded; a clear error when it is not the Llama tokenizer).

What differs:
- corpus: the folder the user gives (the uncopyrighted release has no Books3, BookCorpus2,
  OpenSubtitles, YoutubeSubtitles); the training split is what `train/` holds, the evaluation
  subsets are selected by `meta.pile_set_name` ('Gutenberg (PG-19)', 'ArXiv', 'Github');
- tokenizer: without `_llama`, a SentencePiece BPE tokenizer of 32000 pieces trained on the
  first 50M characters of the training split (byte fallback, byte-exact), and separators by
  rule (`model.separators='auto'`: full stop, '!', '?' and newline pieces); the official code
  splits on '▁.' and newline only, so ordinary sentence-final periods ('word.') do not end a
  segment there;
- precision: float32 here (the paper trained in fp16 mixed precision); the TPU preset computes
  in bfloat16 with float32 parameters and optimizer state;
- data order: grain's shuffled, packed rows (the official code draws 1024-token chunks with the
  HF Trainer's random sampler): the same kind of mixture, not the same batches;
- layers scanned and remat 'full' (memory only; the numbers are the same): at 256 x 1024 on a
  v5e-8 the float32 step needs 37.8 GiB per chip without remat, 18.2 GiB saving the
  projections, 7.4 GiB with full remat, of 16 GiB (train/compile.py, docs/accelerators.md).
"""

from configs import base

ENCODINGS = ('rope', 'bipe_rope', 'alibi', 'bipe_alibi')
PRESETS = ENCODINGS + tuple(f'{e}_llama' for e in ENCODINGS)
TRAIN_STEPS = 490000


def get_config(preset: str = 'bipe_rope'):
  if preset not in PRESETS:
    raise ValueError(f'configs/paper_151m.py:{preset} is not a preset: choose one of '
                     f'{", ".join(PRESETS)}')
  encoding, llama = preset.removesuffix('_llama'), preset.endswith('_llama')
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
  # by the data's tokenizer; 'official' {869, 13}: the Llama tokenizer only
  m.separators = 'official' if llama else 'auto'
  m.block_size = 256
  m.scan_layers = True
  m.remat = 'full'
  d = config.data
  d.dataset = 'pile'
  d.pile_dir = ''  # required: --config.data.pile_dir=/path/or/gs://bucket/pile
  d.pile_subsets = ''  # every subset, as the paper
  d.seq_len = 1024
  d.tokenizer_vocab_size = 32000
  t = config.train
  t.batch_size = 256
  t.learning_rate = 1e-4
  t.warmup_steps = 10000
  t.schedule = 'linear'
  t.weight_decay = 0.01
  t.b1 = 0.9
  t.b2 = 0.98
  t.steps = TRAIN_STEPS
  config.checkpoint.every_steps = 5000
  return config
