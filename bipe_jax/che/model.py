"""The benchmark's encoder as a ModelConfig of this project, and its logits at the outputs.

Ruoss et al. 2023 (and DAPE's CHE runs): 5 layers, width 64, 8 heads, feed-forward 4x width.
Here the blocks are this project's (pre-RMSNorm, SwiGLU, no biases, no dropout) in encoder mode
(`causal=False`; biases two-sided: bipe_jax/encodings/two_sided.py).
"""

import jax
import jax.numpy as jnp

from bipe_jax import model as model_lib
from bipe_jax import positions as positions_lib
from bipe_jax.che import batches as batches_lib
from bipe_jax.config import ModelConfig
from bipe_jax.config import model_config_from_dict
from bipe_jax.tasks.che import Task

TRAIN_MAX_LENGTH = 40


def che_model_config(task: Task, encoding: str, *, max_tokens: int, num_layers: int = 5,
                     hidden_size: int = 64, num_heads: int = 8,
                     train_length: int = TRAIN_MAX_LENGTH) -> ModelConfig:
  """The encoder for `task`; `max_tokens` bounds every row (sizes the learned position tables:
  learned intra (BiPE) and learned absolute). CoPE's position vectors cover the longest training
  row (official: the block size + 1): its positions never exceed a row's length, so the vectors
  past it would stay at their zero init, and longer rows clamp at the last one."""
  return model_config_from_dict(dict(
      vocab_size=batches_lib.vocab_size(task), hidden_size=hidden_size, num_layers=num_layers,
      num_heads=num_heads, ffn_size=4 * hidden_size, position_encoding=encoding,
      max_intra=max_tokens, max_position=max_tokens, train_length=train_length,
      separators='ids' if task.separator_ids else 'auto', separator_ids=task.separator_ids,
      bos_id=-1, eos_id=-1, pad_id=-1, attention_impl='blockwise', block_size=128,
      cope_npos=batches_lib.row_length(task, train_length) + 1,
      causal=False), require_separators=False)


def output_logits(module: model_lib.Transformer, params, batch: dict, output_size: int):
  """Logits [N, O_pad, output_size] float32 at the batch's output positions (`batch` as
  batches.pack makes it, as jnp arrays). The positions are the batch's own streams (BiPE's
  segmentation), not the model's separator rule."""
  pos = positions_lib.BilevelPositions(token=batch['token'], intra=batch['intra'],
                                       inter=batch['inter'],
                                       document=jnp.zeros_like(batch['token']),
                                       valid=batch['valid'])
  logits = module.apply({'params': params}, batch['tokens'], positions=pos,
                        valid_BxT=batch['valid'])
  at = jnp.take_along_axis(logits, batch['out_index'][:, :, None], axis=1)
  return at[..., :output_size]


def init_params(module: model_lib.Transformer, seed: int, tokens: int = 8):
  return module.init(jax.random.PRNGKey(seed), jnp.zeros((1, tokens), jnp.int32))['params']
