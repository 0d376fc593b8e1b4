"""The config's defaults, section by section: every preset (configs/*.py) starts from
`get_base_config()` and overrides fields of it.

Each section is built by its own function so the parts of the project that own them
(model, data, training, checkpointing, mesh) can extend them without touching the others.
"""

import ml_collections

from bipe_jax import config as model_config_lib


def model_defaults() -> ml_collections.ConfigDict:
  """Every field of bipe_jax.config.ModelConfig with its default (documented there: the one
  place the model's fields and defaults are defined)."""
  return ml_collections.ConfigDict(model_config_lib.default_fields())


def data_defaults() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.dataset = 'embedded'  # embedded | text_folder | pile | pg19 | arxiv
  d.data_dir = 'data_cache'  # TFDS data_dir (prepared datasets and the embedded corpus)
  d.text_dir = ''  # for dataset=text_folder
  # dataset=pile: a folder of the Pile's .jsonl(.zst) files (bipe_jax/data/pile.py), the
  # meta.pile_set_name subsets kept ('' = all; aliases pg19, arxiv, github) and the splits built.
  d.pile_dir = ''
  d.pile_subsets = ''
  d.pile_splits = 'train,validation'
  d.tokenizer_path = ''  # '' = the tokenizer trained beside the data in data_dir
  d.tokenizer_sha256 = ''  # recorded by a run (with its copy <workdir>/tokenizer.model)
  d.tokenizer_vocab_size = 4096
  d.seq_len = 128
  d.seed = 0
  d.prefetch = 2  # batches prefetched on a background thread (0 = none)
  d.tokenizer_model_type = 'bpe'  # bpe | unigram (for a tokenizer trained beside the data)
  d.text_field = 'text'  # JSON field holding the text in .jsonl files (text_folder)
  d.validation_fraction = 0.05  # documents held out for validation (embedded, text_folder)
  d.num_epochs = 0  # 0 = repeat the training split forever (reshuffled every epoch)
  # Tokenisation threads of the training pipeline (0 = in the caller). Sized for an accelerator
  # host, which has tens of cores; CPU presets set their own (configs/tiny.py: 2).
  d.num_threads = 16
  # Packed rows are shuffled in windows of this many rows, so a batch mixes many documents
  # (0 = rows in document order, as packed; see bipe_jax/data/packing.py).
  d.shuffle_window = 4096
  return d


def train_defaults() -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  t.steps = 1000
  t.batch_size = 32  # global batch, in sequences
  t.learning_rate = 1e-3
  t.warmup_steps = 100
  t.schedule = 'linear'  # linear (paper) | cosine
  t.end_learning_rate_ratio = 0.0
  t.weight_decay = 0.01
  t.b1 = 0.9
  t.b2 = 0.98
  t.eps = 1e-8
  t.grad_clip = 1.0  # global-norm clipping; 0 = off
  t.grad_accum_steps = 1  # micro-batches per step (a scan inside the step); batch_size is global
  # The lm head and the loss in chunks of at most this many positions per batch shard, their
  # gradients in the same pass (training/chunked_loss.py): no [B, T, V] logits. 0 = the plain
  # logits. Sized by memory: one chunk's float32 logits are 4096 x V x 4 B (0.5 GiB at V=32000).
  # CPU presets set their own (configs/tiny.py: 512, measured fastest on the project's CPU).
  t.loss_chunk_tokens = 4096
  # Logical data shards: the global batch is the concatenation of `data_shards` pipelines, each
  # process reading its share; the same value gives the same batches for any process count
  # (and lets a run resume on another process count). 0 = one shard per data-loading process.
  t.data_shards = 0
  t.seed = 0
  # Fine-tune from a trained model: parameters only (fresh optimizer, step 0) from a workdir
  # ('DIR' or 'DIR@STEP') or a Hugging Face folder; see bipe_jax/training/init_from.py.
  t.init_from = ''
  # A fine-tune keeps its source's position streams (encoding, separators rule); True allows
  # another model.position_encoding / model.separators than the source's.
  t.init_from_allow_encoding_change = False
  t.log_every = 10
  t.eval_every = 0  # steps between validation measurements (0 = none); see training/validation.py
  t.eval_tokens = 16384  # validation tokens scored each time (a fixed slice of the split)
  # MFU denominator: peak FLOP/s of one device. 0 = by device kind (training/flops.py: published
  # peaks; on CPU the CPU seam's measured figure per host, shared by its fake devices).
  t.peak_flops_per_device = 0.0  # > 0 overrides
  return t


def checkpoint_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.every_steps = 100
  c.keep = 3
  c.async_save = True
  c.dir = ''  # '' = <workdir>/checkpoints
  # When every existing checkpoint fails its integrity check, start again from step 0 instead
  # of stopping (the damaged ones are kept in <dir>_corrupt/).
  c.allow_fresh_start = False
  return c


def mesh_defaults() -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.data = -1  # -1 = the remaining devices
  s.fsdp = 1
  s.context = 1  # > 1: the sequence is sharded over this many devices (context parallelism)
  s.tensor = 1
  return s


def get_base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = model_defaults()
  config.data = data_defaults()
  config.train = train_defaults()
  config.checkpoint = checkpoint_defaults()
  config.mesh = mesh_defaults()
  return config
