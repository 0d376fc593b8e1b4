"""The training step's per-chip memory grows linearly with the sequence, on the TPU program.

The step of a small model (2 layers, width 64, blockwise attention at block 64) is compiled for
v5e:2x2 at 1k and 4k tokens per chip (16 and 64 blocks), unrolled and scanned. What the program keeps is read with
XLA's memory-space assignment off (`xla_msa_enable=False`): with it on, the TPU compiler keeps
some of those values in the chip's fixed 128 MiB of VMEM, a share that shrinks as the values
grow, so the HBM temporaries alone grow faster than the program's memory (docs/accelerators.md,
"Reading per-chip temporaries"). Anything kept per (query block, key block) pair would grow 16x
here; dense attention's gradient, whose scores are [T, T], is the control that shows the measure
sees such a term.

The Pallas kernels' gradient keeps no more than blockwise attention's at the 151M preset's head
size (Dh = 64, which a [.., T, Dh] layout would pad to 128 lanes in HBM: pallas/forward.py).
"""

import jax
import jax.numpy as jnp
import pytest

from bipe_jax import attention
from bipe_jax.attention import pallas
from bipe_jax.compile import aot as aot_compile
from bipe_jax.compile import topologies
from tests.compile.test_aot_compile import TOPOLOGY
from tests.compile.test_aot_compile import tiny_config

pytest.importorskip('libtpu', reason='the TPU compiler (requirements-tpu.txt) is not installed')

SHORT, LONG = 1024, 4096  # compiles faster than 4k / 16k (docs/accelerators.md has those)
BLOCK = 64  # 16 and 64 blocks: as many block pairs as 4k / 16k at the presets' block 256
LINEAR_BOUND = 4.4  # 4x the tokens; a quadratic term makes it up to 16x
NO_VMEM_PLACEMENT = {'xla_msa_enable': False}


def step_temporaries(tokens: int, encoding: str, **model) -> int:
  """Per-chip temporaries (bytes) of the training step at `tokens` per chip, batch 1 per chip."""
  model = dict(dict(num_layers=2, max_intra=128, max_position=128, block_size=BLOCK,
                    train_length=128, attention_impl='blockwise'), **model)
  config = tiny_config(encoding, (4, 1, 1), **model)
  config.data.seq_len = tokens
  config.train.batch_size = 4
  report = aot_compile.compile_for_topology(config, TOPOLOGY, compiler_options=NO_VMEM_PLACEMENT)
  return report.steps[0].temp_bytes


def growth(encoding: str, **model) -> float:
  return step_temporaries(LONG, encoding, **model) / step_temporaries(SHORT, encoding, **model)


@pytest.mark.slow  # two TPU compiles of a training step: make test, not make test-fast
@pytest.mark.parametrize('encoding,scan_layers', [('rope', False), ('bipe_alibi', True)])
def test_step_memory_grows_linearly_with_tokens(encoding, scan_layers):
  ratio = growth(encoding, scan_layers=scan_layers)
  assert ratio <= LINEAR_BOUND, (f'{encoding} scan_layers={scan_layers}: {SHORT} -> {LONG} '
                                 f'tokens grew {ratio:.2f}x')


@pytest.mark.slow
def test_the_measure_sees_a_quadratic_term():
  """Dense attention keeps [T, T] scores: the same measure must see far more than 4x."""
  short, long = (attention_gradient_temporaries('dense', tokens=n, heads=4, head_dim=32,
                                                compiler_options=NO_VMEM_PLACEMENT)
                 for n in (SHORT // 2, LONG // 2))
  assert long / short > 10, f'dense attention grew only {long / short:.2f}x for 4x the tokens'

def attention_gradient_temporaries(impl: str, tokens: int = 8192, heads: int = 12,
                                   head_dim: int = 64, compiler_options=None) -> int:
  """Temporaries (bytes) of the gradient of one causal attention [1, H, T, Dh] float32 (no
  bias) compiled for one v5e chip, through `impl` ('pallas', 'blockwise' (block 256) or
  'dense')."""
  device = topologies.platform_devices('tpu', TOPOLOGY)[0]
  on_chip = jax.sharding.SingleDeviceSharding(device)
  qkv = jax.ShapeDtypeStruct((1, heads, tokens, head_dim), jnp.float32, sharding=on_chip)
  positions = jax.ShapeDtypeStruct((1, tokens), jnp.int32, sharding=on_chip)

  def loss(q, k, v, pos):
    mask = attention.AttentionMask.causal_from_positions(pos)
    if impl == 'pallas':
      out = pallas.pallas_attention(q, k, v, mask=mask, block_q=256, block_k=256)
    elif impl == 'blockwise':
      out = attention.blockwise_attention(q, k, v, mask=mask, block_size=256)
    else:
      out = attention.dense_attention(q, k, v, mask=mask)
    return jnp.sum(out ** 2)

  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  compiled = grad.lower(qkv, qkv, qkv, positions).compile(compiler_options=compiler_options)
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_the_pallas_gradient_keeps_no_more_than_blockwise():
  kernel, blockwise = (attention_gradient_temporaries(impl) for impl in ('pallas', 'blockwise'))
  assert kernel <= blockwise, f'Pallas {kernel / 2**20:.1f} MiB > blockwise {blockwise / 2**20:.1f} MiB'
