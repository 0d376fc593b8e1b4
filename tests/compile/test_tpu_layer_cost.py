"""benchmarks/tpu_layer_cost.py: the layer's model FLOPs against a hand count, the rows it
measures and their order, and (libtpu, v5e:2x2) that the stock anchor's splash kernels are
priced: XLA's FLOPs of the priced program exceed the unpriced one's by the attached estimates.
The benchmark's run at its smallest size is in tests/project/test_benchmarks_smoke_tpu.py."""

import argparse

import pytest

from benchmarks import tpu_layer_cost as bench
from bipe_jax.attention.pallas import cost as pallas_cost

TINY = dict(batch_per_chip=1, seq=256, width=128, heads=2, ffn=256, vocab=512, block_size=128)


def test_layer_model_flops_by_hand():
  d, h, dh, f, t, tokens = 128, 2, 64, 256, 256, 512
  fields = dict(hidden_size=d, num_heads=h, num_kv_heads=h, head_dim=dh, ffn_size=f,
                vocab_size=512, position_encoding='rope')
  forward = (2 * d * 3 * h * dh  # q, k, v
             + 2 * h * dh * d  # out
             + 2 * 2 * h * dh * (t + 1) / 2  # scores and values, causal
             + 3 * 2 * d * f)  # SwiGLU
  config = type('Config', (), fields)()
  assert bench.layer_model_flops(config, t, tokens) == pytest.approx(3 * forward * tokens)


def test_plan_puts_the_anchor_and_the_deciding_rows_first_and_keeps_each_supported_path():
  rows = bench.plan(['fire', 'rope', 'bipe_alibi'], bench.TPU_IMPLS, anchor=True)
  assert rows == [(bench.ANCHOR, None), ('rope', 'pallas'), ('bipe_alibi', 'pallas'),
                  ('fire', 'blockwise'), ('fire', 'dense'),  # FIRE: no kernel, not fusable
                  ('rope', 'blockwise'), ('rope', 'dense'), ('rope', 'fused'),
                  ('bipe_alibi', 'blockwise'), ('bipe_alibi', 'dense'), ('bipe_alibi', 'fused')]
  assert bench.plan(['dape_kerple', 'dape_fire'], ('pallas', 'blockwise'), anchor=False) == [
      ('dape_kerple', 'pallas'), ('dape_kerple', 'blockwise'),  # V1 on Kerple: the fused kernel
      ('dape_fire', 'blockwise')]  # DAPE on FIRE: no Pallas path


def test_block_sizes_cost_each_pallas_row_once_per_size():
  rows = bench.plan(['fire', 'rope'], ('pallas', 'dense'), anchor=True)
  assert bench.with_block_sizes(rows, (128, 512)) == [
      (bench.ANCHOR, None, None), ('rope', 'pallas', 128), ('rope', 'pallas', 512),
      ('fire', 'dense', None), ('rope', 'dense', None)]
  assert bench.with_block_sizes(rows, ()) == [r + (None,) for r in rows]


def test_the_block_table_has_a_line_per_encoding_and_a_column_per_size():
  anchor = {'encoding': bench.ANCHOR, 'impl': 'splash', 'ms': 20.0, 'mfu': 0.5,
            'concat_bitcasts': 21}
  row = lambda enc, block, ms, **kw: {'encoding': enc, 'impl': f'pallas, block {block}',
                                      'block': block, 'ms': ms, 'mfu': 10.0 / ms, **kw}
  rows = [anchor, row('rope', 128, 25.0), row('rope', 512, 16.0),
          row('alibi', 128, 20.0), row('alibi', 512, 3e5, concat_bitcasts=157)]
  lines = bench.block_table(rows).splitlines()
  assert 'block 128' in lines[0] and 'block 512' in lines[0]
  assert lines[2].split('|')[1:4] == [' rope ', ' 25 (40.0 %, 1.25x stock) ',
                                      ' 16 (62.5 %, 0.80x stock) ']
  # a sentinel residue of XLA's ConcatBitcast pricing is no figure (hlo_stats.optimal_seconds)
  assert lines[3].split('|')[1:4] == [' alibi ', ' 20 (50.0 %, 1.00x stock) ', ' - ']
  assert bench.block_table(rows[:2]) == ''  # one size: no table


@pytest.mark.slow  # two TPU compiles of the tiny anchor layer
def test_the_anchor_prices_splash_with_the_projects_estimates():
  pytest.importorskip('libtpu', reason='the TPU compiler (requirements-tpu.txt) is not installed')
  from bipe_jax.compile import topologies
  devices = topologies.topology_devices('v5e:2x2')
  args = argparse.Namespace(num_devices=len(devices), **TINY)
  config = bench.shaped(bench.preset_config('configs/paper_151m_tpu.py', 'rope'), args)
  priced = bench.anchor_row(config, devices, 197e12, block=128)
  unpriced = bench.anchor_row(config, devices, 197e12, block=128, priced=False)
  assert 'error' not in priced and 'error' not in unpriced
  assert priced['ms'] > unpriced['ms'] > 0
  one_row = (1, 2, 2, 256, 256, 64, 128, 128, True, 2)
  forward = pallas_cost.forward_cost(*one_row).flops
  dq, dkv = (c.flops for c in pallas_cost.backward_cost(*one_row))
  # one batch row per chip; remat may run the forward kernel twice (forward and recompute)
  added = priced['xla_flops_per_chip'] - unpriced['xla_flops_per_chip']
  assert added in (pytest.approx(forward + dq + dkv), pytest.approx(2 * forward + dq + dkv))
