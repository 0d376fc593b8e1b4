"""The matmul forms of the compiled training gradient on the cpu kernels path (a performance
property that the code arranges on purpose, so a refactor that loses it fails here, not
silently in a benchmark).

XLA's CPU dot that contracts the leading (row) axis of its left operand runs far slower than a
plain row-major matmul (benchmarks/README.md). Two places of bipe_jax/kernels/cpu*.py keep XLA
from choosing that form: the attention backward's dK and dV
(cpu_attention._transposed_product) and the head's weight gradient in the chunked loss (the
hidden states enter the loop already transposed: cpu.lm_head_scan_inputs).
"""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax import config as config_lib
from bipe_jax.model import Transformer
from bipe_jax.training import chunked_loss

B, T, D, HEADS, V = 4, 128, 128, 4, 1024  # V differs from the FFN width 4 * D


def _dots(hlo: str) -> list[str]:
  return [line for line in hlo.split('\n') if re.search(r'= f32\[[0-9,]*\]\S* dot\(', line)]


@functools.lru_cache(maxsize=None)  # both tests read the rope program: compile it once
def _compiled_gradient_hlo(position_encoding: str) -> str:
  cfg = config_lib.validate_model_config(config_lib.ModelConfig(
      vocab_size=V, hidden_size=D, num_layers=1, num_heads=HEADS, num_kv_heads=HEADS,
      ffn_size=4 * D, max_intra=T, max_position=T, train_length=T, separator_ids=(3,),
      position_encoding=position_encoding, attention_impl='dense', kernels='cpu'))
  model = Transformer(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(4, V, size=(B, T)), jnp.int32)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), tokens)['params'])

  def loss(p):
    hidden = model.apply({'params': p}, tokens, return_hidden=True)
    return chunked_loss.lm_head_nll_sum(hidden, p['lm_head']['kernel'], tokens,
                                        jnp.ones((B, T), jnp.float32), chunk_len=T // 2,
                                        kernels='cpu')

  return jax.jit(jax.grad(loss)).lower(params).compile().as_text()


def test_attention_backward_has_no_batched_dot_contracting_the_query_axis():
  for encoding in ('rope', 'alibi'):
    dots = _dots(_compiled_gradient_hlo(encoding))
    batched = [d for d in dots if 'lhs_batch_dims' in d]
    assert len(batched) >= 4, dots  # the forward's two and the backward's dQ, dP at least
    slow = [d for d in batched if 'lhs_contracting_dims={2}' in d]
    assert not slow, f'{encoding}: attention products in the slow form:\n' + '\n'.join(slow)


def test_head_weight_gradient_is_a_row_major_matmul():
  dots = _dots(_compiled_gradient_hlo('rope'))
  head = [d for d in dots if re.search(rf'= f32\[{D},{V}\]', d)]
  assert head, 'no [D, V] product (the head kernel gradient) in the compiled gradient'
  assert all('lhs_contracting_dims={1}' in d for d in head), '\n'.join(head)
