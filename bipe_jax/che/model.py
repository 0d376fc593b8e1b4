"""The benchmark's encoder as a ModelConfig of this project, and its logits at the outputs.

Ruoss et al. 2023 (and DAPE's CHE runs): 5 layers, width 64, 8 heads, feed-forward 4x width.
Two blocks (`architecture`), both in encoder mode (`causal=False`; biases two-sided:
bipe_jax/encodings/two_sided.py) with the same attention and encodings:
  project  this project's Transformer: pre-RMSNorm, SwiGLU, no biases, no dropout;
  peer     the benchmark's block (peer.py): post-LayerNorm, ReLU MLP, dropout 0.1, embeddings
           x sqrt(D), biases on the MLP and the output head.
"""

import jax
import jax.numpy as jnp

from bipe_jax import model as model_lib
from bipe_jax import positions as positions_lib
from bipe_jax import schemes
from bipe_jax.che import batches as batches_lib
from bipe_jax.che import peer
from bipe_jax.config import ModelConfig
from bipe_jax.config import model_config_from_dict
from bipe_jax.tasks.che import Task

TRAIN_MAX_LENGTH = 40
ARCHITECTURES = ('project', 'peer')


def check_architecture(architecture: str) -> str:
  if architecture not in ARCHITECTURES:
    raise ValueError(f'--architecture={architecture!r} must be one of {", ".join(ARCHITECTURES)}.')
  return architecture


def build_module(cfg: ModelConfig, task: Task, architecture: str = 'project'):
  """The encoder of `architecture` for `cfg` (che_model_config) and `task`'s output classes."""
  if check_architecture(architecture) == 'peer':
    return peer.PeerEncoder(cfg, task.output_size)
  return model_lib.Transformer(cfg)


def che_model_config(task: Task, encoding: str, *, max_tokens: int, num_layers: int = 5,
                     hidden_size: int = 64, num_heads: int = 8,
                     train_length: int = TRAIN_MAX_LENGTH,
                     randomized_positions: int = 0) -> ModelConfig:
  """The encoder for `task`; `max_tokens` bounds every row (sizes the learned position tables:
  learned intra (BiPE) and learned absolute; `randomized_positions` = L > 0: the absolute table
  has L rows, and output_logits draws positions of 0..L-1 when given a key). CoPE's position vectors cover the longest training
  row (official: the block size + 1): its positions never exceed a row's length, so the vectors
  past it would stay at their zero init, and longer rows clamp at the last one."""
  scheme = schemes.get_scheme(encoding)
  # The task-dependent sizes only where the scheme reads them: otherwise the config's defaults,
  # so tasks of one vocabulary build equal models, which share compiled programs in a grid.
  sizes = {}
  if scheme.input == 'learned' or scheme.transform == 'cope':
    sizes = dict(max_intra=max_tokens, max_position=max_tokens,
                 cope_npos=batches_lib.row_length(task, train_length) + 1)
  return model_config_from_dict(dict(
      vocab_size=batches_lib.vocab_size(task), hidden_size=hidden_size, num_layers=num_layers,
      num_heads=num_heads, ffn_size=4 * hidden_size, position_encoding=encoding,
      train_length=train_length,
      separators='ids' if task.separator_ids else 'auto', separator_ids=task.separator_ids,
      bos_id=-1, eos_id=-1, pad_id=-1, attention_impl='blockwise', block_size=128,
      causal=False, randomized_positions=randomized_positions, **sizes),
      require_separators=False)


def output_logits(module, params, batch: dict, output_size: int, dropout_rng=None,
                  positions_rng=None):
  """Logits [N, O_pad, output_size] float32 at the batch's output positions (`batch` as
  batches.pack makes it, as jnp arrays). The positions are the batch's own streams (BiPE's
  segmentation), not the model's separator rule; `positions_rng` given, randomized from it
  (when the config sets randomized_positions). `dropout_rng`: the peer block's dropout is on
  (training) when given, off (scoring) when None; the project's block has none."""
  pos = positions_lib.BilevelPositions(token=batch['token'], intra=batch['intra'],
                                       inter=batch['inter'],
                                       document=jnp.zeros_like(batch['token']),
                                       valid=batch['valid'])
  if positions_rng is not None and module.config.randomized_positions:
    # Randomized positions (model.randomized_positions = L), drawn in training and in scoring
    # as the benchmark does (docs/design.md): each row an ordered random subset of 0..L-1.
    pos = model_lib.randomize_positions(module.config, pos, positions_rng)
  if isinstance(module, peer.PeerEncoder):
    logits = module.apply({'params': params}, batch['tokens'], positions=pos,
                          deterministic=dropout_rng is None,
                          rngs=None if dropout_rng is None else {'dropout': dropout_rng})
  else:
    logits = module.apply({'params': params}, batch['tokens'], positions=pos,
                          valid_BxT=batch['valid'])
  at = jnp.take_along_axis(logits, batch['out_index'][:, :, None], axis=1)
  return at[..., :output_size]


def init_params(module, seed: int, tokens: int = 8):
  if isinstance(module, peer.PeerEncoder):
    return peer.init_params(module, seed, tokens)
  return module.init(jax.random.PRNGKey(seed), jnp.zeros((1, tokens), jnp.int32))['params']
