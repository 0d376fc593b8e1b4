"""Planning figures from XLA's TPU cost model (compile/step_cost.py, train/compile.py) and the
Pallas kernels' cost estimates (pallas/cost.py).

The scaling logic is checked against hand computations; the costing programs are checked to be
loop-free (bipe_jax/loop_unroll.py unrolls the chunked loss); on a v5e:2x2 topology (libtpu) the
prediction for an unrolled 3-layer tiny model is checked against compiling that program itself,
and the Pallas forward's FLOPs in XLA's cost analysis against the hand count.
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax.attention.mask import AttentionMask
from bipe_jax.attention.pallas import cost as pallas_cost
from bipe_jax.compile import aot
from bipe_jax.compile import cli as compile_cli
from bipe_jax.compile import hlo_stats
from bipe_jax.compile import step_cost
from bipe_jax.compile import topologies
from bipe_jax.training import chunked_loss
from bipe_jax import loop_unroll
from configs import paper_151m_tpu
from configs import tiny


def _prediction(**fields):
  values = dict(topology='v5e:2x4', device_kind='TPU v5 lite', num_devices=8, num_layers=12,
                grad_accum_steps=1, seconds=(0.003, 0.005), flops=(1e12, 1.5e12),
                while_loops=0, tokens_per_step=256 * 1024, model_flops_per_chip=2e13,
                peak_flops=197e12, train_steps=490000)
  values.update(fields)
  return step_cost.StepPrediction(**values)


def test_layer_scaling_by_hand():
  # 1 layer 3 ms, 2 layers 5 ms: 2 ms per layer, 1 ms outside the layers; 12 layers: 25 ms
  rest, per_layer = step_cost.scale_by_layers(0.003, 0.005, 12)
  assert math.isclose(per_layer, 0.002) and math.isclose(rest, 0.001)
  p = _prediction()
  assert math.isclose(p.step_seconds, 0.025)
  assert math.isclose(p.tokens_per_second_per_chip, 262144 / 8 / 0.025)  # 1,310,720
  assert math.isclose(p.mfu, 2e13 / 0.025 / 197e12)
  assert math.isclose(p.xla_flops_per_chip, 0.5e12 + 12 * 0.5e12)
  assert p.budget_tokens == 490000 * 262144
  assert math.isclose(p.budget_hours, 490000 * 0.025 / 3600)
  # micro-batches: the step is that many micro-steps of batch / accumulation
  assert math.isclose(_prediction(grad_accum_steps=4).step_seconds, 0.1)
  assert _prediction(peak_flops=0.0).mfu == 0.0
  record = p.to_json()
  assert record['label'] == step_cost.LABEL and math.isclose(record['step_seconds'], 0.025)
  text = step_cost.format_prediction(p)
  assert 'not a measurement' in text and '25 ms' in text and 'in 3.403 hours on v5e:2x4' in text
  assert 'lower bound' in step_cost.format_prediction(_prediction(while_loops=2))


def test_costing_config_is_loop_free_and_leaves_the_preset_alone():
  config = paper_151m_tpu.get_config('bipe_rope')
  config.train.grad_accum_steps = 4
  c = step_cost.costing_config(config, 2)
  assert (c.model.num_layers, c.model.scan_layers) == (2, False)
  # attention_impl 'auto': the Pallas kernel on a TPU (its own tiles, costed by its estimate)
  assert c.model.attention_impl == 'auto' and c.model.block_size == config.model.block_size
  dape = paper_151m_tpu.get_config('alibi')
  dape.model.position_encoding = 'dape_fire'  # blockwise on a TPU: its own blocks, unrolled
  assert step_cost.costing_config(dape, 1).model.block_size == dape.model.block_size < 1024
  assert step_cost.costing_config(dape, 1, one_block=True).model.block_size == 1024
  # one_block leaves a Pallas step's tiles alone
  assert step_cost.costing_config(config, 1, one_block=True).model.block_size == (
      config.model.block_size)
  assert (c.train.batch_size, c.train.grad_accum_steps) == (64, 1)
  assert (config.model.num_layers, config.model.scan_layers, config.train.batch_size) == (
      12, True, 256)
  assert c.model.dtype == 'bfloat16' and c.model.remat == 'save_projections'


def test_predict_says_which_program_it_compiles_and_the_time_so_far(monkeypatch):
  """The progress lines of the prediction (train/compile.py prints them), with the compiles
  replaced: the second program does not fit, so the prediction stops with one line."""
  clock = iter([0.0, 0.0, 0.0, 30.0, 30.0, 30.0, 30.0, 100.0, 100.0])
  monkeypatch.setattr(step_cost, '_now', lambda: next(clock))
  calls = []

  def compile_for_topology(config, *_, **__):
    calls.append(int(config.model.num_layers))
    oom = '' if len(calls) == 1 else 'RESOURCE_EXHAUSTED: 17G exceeds 15.75G'
    figures = type('Step', (), dict(out_of_memory=oom, optimal_seconds=1e-3, flops=1e12,
                                    while_loops=0))
    return type('Report', (), dict(steps=[figures], device_kind='TPU v5 lite'))

  monkeypatch.setattr(step_cost.aot, 'compile_for_topology', compile_for_topology)
  lines = []
  with pytest.raises(step_cost.CostingError, match='the 2-layer costing program does not fit'):
    step_cost.predict(tiny.get_config(), 'v5e:2x2', [None] * 4, progress=lines.append)
  assert calls == [1, 2]
  assert lines == [
      'predicting: compiling costing program 1 of 2 (1 unrolled layer); 0 s so far',
      'predicting: costing program 1 of 2 compiled in 30 s; 30 s so far',
      'predicting: compiling costing program 2 of 2 (2 unrolled layers); 30 s so far',
      'predicting: costing program 2 of 2 compiled in 70 s; 100 s so far']


def test_blockwise_is_costed_in_one_block_then_in_its_own_blocks_when_that_does_not_fit(
    monkeypatch):
  """DAPE-FIRE (blockwise on a TPU): the one-block costing program does not fit, so both
  programs are compiled again in the step's own blocks, and the prediction says so."""
  monkeypatch.setattr(step_cost, '_now', lambda: 0.0)
  calls = []

  def compile_for_topology(config, *_, **__):
    calls.append((int(config.model.num_layers), int(config.model.block_size)))
    oom = 'RESOURCE_EXHAUSTED: 16.02G' if config.model.block_size >= 1024 else ''
    figures = type('Step', (), dict(out_of_memory=oom, optimal_seconds=1e-3 * len(calls),
                                    flops=1e12, while_loops=0))
    return type('Report', (), dict(steps=[figures], device_kind='TPU v5 lite'))

  monkeypatch.setattr(step_cost.aot, 'compile_for_topology', compile_for_topology)
  monkeypatch.setattr(step_cost.aot, 'resolve', lambda c, n: type('R', (), dict(model=None)))
  monkeypatch.setattr(step_cost.flops_lib, 'train_flops_per_token', lambda *a: 1.0)
  dape = paper_151m_tpu.get_config('alibi')
  dape.model.position_encoding = 'dape_fire'
  block = int(dape.model.block_size)
  lines = []
  p = step_cost.predict(dape, 'v5e:2x4', [None] * 8, progress=lines.append)
  assert calls == [(1, 1024), (1, block), (2, block)]
  assert p.seconds == (2e-3, 3e-3) and p.attention_costing == 'in its own blocks'
  assert "costing the step's own blocks" in lines[2]
  assert 'costed in its own blocks' in step_cost.format_prediction(p)


def _while_count(fn, *args) -> int:
  return hlo_stats.count_while_loops(jax.jit(fn).lower(*args).compile().as_text())


def test_the_chunked_loss_unrolls_only_inside_unrolled():
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(2, 16, 8)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(8, 11)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, (2, 16)), jnp.int32)
  weights = jnp.ones((2, 16), jnp.float32)

  def make_loss():  # a new function per trace: JAX caches a function's traces
    return lambda h, w: chunked_loss.lm_head_nll_sum(h, w, targets, weights, chunk_len=4)

  def grad():
    return jax.grad(make_loss(), argnums=(0, 1))

  assert _while_count(grad(), hidden, kernel) >= 1  # training: one compiled chunk body
  with loop_unroll.unrolled():
    assert _while_count(grad(), hidden, kernel) == 0
    unrolled = jax.jit(grad())(hidden, kernel)
  assert loop_unroll.scan_unroll() == 1
  for a, b in zip(unrolled, jax.jit(grad())(hidden, kernel)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_blockwise_attention_unrolls_its_block_scans_only_inside_unrolled():
  """The costing programs' blockwise attention (DAPE's path on a TPU) is loop-free and keeps
  its blocks, values and gradients unchanged."""
  from bipe_jax import attention  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.normal(size=(1, 2, 32, 8)), jnp.float32) for _ in range(3))
  mask = AttentionMask.causal_from_positions(jnp.broadcast_to(jnp.arange(32), (1, 32)))

  def grad():  # a new function per trace: JAX caches a function's traces
    return jax.grad(lambda q, k, v: jnp.sum(attention.blockwise_attention(
        q, k, v, mask=mask, block_size=8) ** 2), argnums=(0, 1, 2))

  assert _while_count(grad(), q, k, v) >= 2  # training: query and key block loops
  with loop_unroll.unrolled():
    assert _while_count(grad(), q, k, v) == 0
    unrolled = jax.jit(grad())(q, k, v)
  for a, b in zip(unrolled, jax.jit(grad())(q, k, v)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_count_while_loops_on_hlo_text():
  text = ('ENTRY %main {\n  %w = (s32[], f32[4]) while((s32[], f32[4]) %t), condition=%c, '
          'body=%b\n  %x = f32[4] add(f32[4] %a, f32[4] %a)\n'
          '  %while.2 = (s32[]) while((s32[]) %u), condition=%c2, body=%b2\n}')
  assert hlo_stats.count_while_loops(text) == 2
  assert hlo_stats.count_while_loops('%body_while = f32[] add(%a, %b)') == 0


def test_optimal_seconds_adds_back_the_uncosted_concat_bitcasts():
  call = '  %c.{} = f32[64,4096] custom-call(%a, %b), custom_call_target="ConcatBitcast"\n'
  text = ''.join(call.format(i) for i in range(5))
  assert math.isclose(hlo_stats.optimal_seconds({'optimal_seconds': -4.99985}, text), 1.5e-4,
                      rel_tol=1e-6)
  assert hlo_stats.optimal_seconds({'optimal_seconds': 2e-3}, text) == 2e-3
  assert hlo_stats.optimal_seconds({'optimal_seconds': -6.5}, text) == 0.0  # still unknown
  # more in the text than are costed (unrolled blockwise programs): the fraction, not n
  assert math.isclose(hlo_stats.optimal_seconds({'optimal_seconds': -2.75}, text), 0.25)
  assert hlo_stats.optimal_seconds({}, '') == 0.0


@pytest.mark.parametrize('tq,tk,bq,bk,causal,want', [
    (256, 256, 128, 128, True, 3),  # diagonal + below: 1 + 2
    (256, 256, 128, 128, False, 4),
    (512, 512, 128, 256, True, 6),  # query tiles 0..3 see key tiles 1, 1, 2, 2
    (128, 512, 128, 128, True, 4),  # the last 128 queries see every key
    (384, 384, 128, 128, True, 6),
])
def test_visible_tiles_by_hand(tq, tk, bq, bk, causal, want):
  assert pallas_cost.visible_tiles(tq, tk, bq, bk, causal) == want
  # a loop-based count: tile (i, j) computed iff its first key <= its last query position
  brute = sum(1 for i in range(tq // bq) for j in range(tk // bk)
              if not causal or j * bk <= tk - tq + (i + 1) * bq - 1)
  assert brute == want


def test_pallas_cost_estimates_by_hand():
  est = pallas_cost.forward_cost(2, 4, 2, 256, 256, 64, 128, 128, True, 2)
  assert est.flops == 2 * 4 * 3 * 4 * 128 * 128 * 64
  assert est.transcendentals == 2 * 4 * 3 * 128 * 128 + 2 * 4 * 256
  # B 2, H 4, G 2, 2 x 2 tiles of 128; query tile 0 reads key tile 0, tile 1 key tiles 0 and 1
  # (tile 0 kept from the row before): per (row, head) 2 query blocks, 2 key blocks each of k, v
  block = 64 * 128 * 2  # a [Dh, 128] bfloat16 block
  assert est.bytes_accessed == (16 * block * 2  # q in, out written
                                + 16 * 8 * 128 * 4  # log-sum-exp rows, 8 sublanes
                                + 2 * 16 * block  # k, v
                                + 16 * 8 * 128 * 4  # q_info rows [8, 128] int32
                                + 16 * 8 * 128 * 4  # k_info [8, 128] int32
                                + 8 * 8 * 128 * 4)  # params [1, 1] per head (and row)
  dq, dkv = pallas_cost.backward_cost(2, 4, 2, 256, 256, 64, 128, 128, True, 2)
  assert dq.flops == 6 * 2 * 4 * 3 * 128 * 128 * 64 and dkv.flops == 8 * 2 * 4 * 3 * 128 * 128 * 64
  assert dq.transcendentals == dkv.transcendentals == 2 * 4 * 3 * 128 * 128


# ----------------------------------------------------------------- on a TPU topology (libtpu)

TOPOLOGY = 'v5e:2x2'


def _tiny(num_layers):
  config = tiny.get_config()
  m = config.model
  # vocabulary 4096: the compiler's ConcatBitcasts appear (hlo_stats.optimal_seconds)
  m.num_layers, m.hidden_size, m.num_heads, m.ffn_size, m.vocab_size = num_layers, 64, 4, 128, 4096
  m.max_intra = m.max_position = m.block_size = m.train_length = 32
  m.separators, m.separator_ids = 'ids', (13,)
  config.data.seq_len = 32
  config.train.batch_size = 8
  config.train.loss_chunk_tokens = 16  # 4 chunks of the loss per batch shard
  config.train.steps = 1000
  return config


@pytest.mark.slow
def test_prediction_matches_the_compiled_program_and_the_cli_prints_it(tmp_path, capsys):
  """A 3-layer tiny model, unrolled: its loop-free step compiled directly (the chunked loss
  unrolled too) costs what the 1- and 2-layer programs predict for 3 layers; train/compile.py's
  printout and JSON carry the figures."""
  pytest.importorskip('libtpu', reason='the TPU compiler (requirements-tpu.txt) is not installed')
  config = _tiny(3)
  devices = topologies.topology_devices(TOPOLOGY)
  output = tmp_path / 'figures.json'
  assert compile_cli.run(config, TOPOLOGY, predict=True, output=str(output)) == 0
  printed = capsys.readouterr().out
  record = json.loads(output.read_text())
  p = record['prediction']
  assert p['label'] == step_cost.LABEL and p['while_loops'] == 0
  s1, s2 = p['seconds']
  assert 0 < s1 < s2
  assert math.isclose(p['step_seconds'], (2 * s1 - s2) + 3 * (s2 - s1))  # hand scaling
  assert math.isclose(p['budget_hours'], 1000 * p['step_seconds'] / 3600)
  assert math.isclose(p['tokens_per_second_per_chip'], 8 * 32 / 4 / p['step_seconds'])
  assert math.isclose(p['model_flops_per_chip'], record['steps'][0]['model_flops'])
  assert 'predicted step (XLA TPU cost model estimate, not a measurement)' in printed
  assert f'{p["budget_hours"]:.4g} hours on v5e:2x2' in printed
  # the 3-layer step itself, made loop-free the same way, compiled once
  with loop_unroll.unrolled():
    direct = aot.compile_for_topology(step_cost.costing_config(config, 3), TOPOLOGY,
                                              devices=devices).steps[0]
  assert direct.while_loops == 0
  assert math.isclose(p['step_seconds'], direct.optimal_seconds, rel_tol=0.05), (
      p['step_seconds'], direct.optimal_seconds)
  assert math.isclose(p['xla_flops_per_chip'], direct.flops, rel_tol=0.02)


def test_pallas_forward_is_costed_on_tpu():
  pytest.importorskip('libtpu', reason='the TPU compiler (requirements-tpu.txt) is not installed')
  from bipe_jax.attention import pallas  # pylint: disable=g-import-not-at-top
  device = topologies.topology_devices(TOPOLOGY)[0]
  b, h, t, d = 1, 2, 256, 128
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))

  def attend(q, k, v):
    return pallas.pallas_attention(q, k, v, mask=AttentionMask.causal_from_positions(pos),
                                   tile_bias=pallas.TileBias('none'), bias_params_HxP=None,
                                   block_q=128, block_k=128, interpret=False)

  shape = jax.ShapeDtypeStruct((b, h, t, d), jnp.bfloat16,
                               sharding=jax.sharding.SingleDeviceSharding(device))
  compiled = jax.jit(attend).trace(shape, shape, shape).lower(
      lowering_platforms=('tpu',)).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  want = pallas_cost.forward_cost(b, h, h, t, t, d, 128, 128, True, 2)
  # 3 of the 4 tiles, 4 * 128 * 128 * 128 FLOPs each; outside the kernel, the tile ranges'
  # integer bookkeeping (tile_ranges.py) adds about a thousand
  assert want.flops <= cost['flops'] <= 1.0001 * want.flops
  assert cost['transcendentals'] == want.transcendentals
  assert cost['optimal_seconds'] > 0


def test_pallas_backward_with_documents_and_fox_pruning_compiles_for_tpu():
  """The three kernels with per-head tile ranges (FoX's pruning), documents and padding, their
  index maps reading the scalar-prefetched ranges, compile under Mosaic; XLA's cost of the
  gradient holds the three estimates."""
  pytest.importorskip('libtpu', reason='the TPU compiler (requirements-tpu.txt) is not installed')
  from bipe_jax.attention import pallas  # pylint: disable=g-import-not-at-top
  device = topologies.topology_devices(TOPOLOGY)[0]
  b, h, t, d = 1, 2, 256, 128
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  doc = (pos >= 100).astype(jnp.int32)
  mask = AttentionMask(q_pos=pos, k_pos=pos, k_valid=pos < 240, q_document=doc, k_document=doc)

  def loss(q, k, v, c):
    out = pallas.pallas_attention(q, k, v, mask=mask, q_streams=c, k_streams=c,
                                  tile_bias=pallas.TileBias('fox'), block_q=128, block_k=128,
                                  interpret=False, fox_log_pruning_tolerance=-10.0)
    return jnp.sum(out.astype(jnp.float32) ** 2)

  one = jax.sharding.SingleDeviceSharding(device)
  qkv = jax.ShapeDtypeStruct((b, h, t, d), jnp.bfloat16, sharding=one)
  c = jax.ShapeDtypeStruct((b, t, h), jnp.float32, sharding=one)
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(qkv, qkv, qkv, c).lower(
      lowering_platforms=('tpu',)).compile()
  assert compiled.as_text().count('tpu_custom_call') >= 3  # forward, dQ, dK / dV
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  fwd = pallas_cost.forward_cost(b, h, h, t, t, d, 128, 128, True, 2, 1, True, b * h * 2)
  dq, dkv = pallas_cost.backward_cost(b, h, h, t, t, d, 128, 128, True, 2, 1, True, b * h * 2)
  kernels = fwd.flops + dq.flops + dkv.flops
  assert kernels <= cost['flops'] <= 1.01 * kernels


def test_the_presets_quote_the_figures_the_tools_measured():
  """configs/paper_151m.py's memory figures and configs/paper_151m_tpu.py's predicted tokens/s
  are those of train/compile.py's runs recorded in docs/accelerators.md (not older ones)."""
  import os  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  from configs import paper_151m  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with open(os.path.join(root, 'docs', 'accelerators.md'), encoding='utf-8') as f:
    doc = ' '.join(f.read().split())
  measured = re.search(r'`model\.remat=none` ([\d.]+) GiB per chip \(refused\), '
                       r'`save_projections` ([\d.]+) GiB \(refused\), `full` ([\d.]+) GiB', doc)
  assert measured, 'docs/accelerators.md: the 151M remat figures moved'
  import decimal  # pylint: disable=g-import-not-at-top
  none, projections, full = (decimal.Decimal(x).quantize(decimal.Decimal('0.1'),
                                                         decimal.ROUND_HALF_UP)
                             for x in measured.groups())  # 18.15 -> 18.2, as written
  docstring = ' '.join(paper_151m.__doc__.split())
  assert (f'needs {none} GiB per chip without remat, {projections} GiB saving the '
          f'projections, {full} GiB with full remat') in docstring
  per_chip = re.search(r'([\d,]+) tokens/s per chip', doc)
  assert per_chip, 'docs/accelerators.md: the predicted tokens/s moved'
  per_chip = int(per_chip.group(1).replace(',', ''))
  tpu_doc = ' '.join(paper_151m_tpu.__doc__.split())
  slice_k = round(per_chip * 8 / 1000)  # v5e-8: 8 chips
  assert f'about {slice_k}k tokens/s ({per_chip / 1000:.1f}k per chip' in tpu_doc, tpu_doc
  assert '0.5-0.7M' not in tpu_doc and '27.9 GiB' not in docstring
  fits = re.search(r'`remat=save_projections`, loss chunks of 4096: ([\d.]+) GiB per chip', doc)
  assert fits and f'compiles to {fits.group(1)} of 16 GiB' in tpu_doc


def test_a_kernel_out_of_vmem_is_not_advised_as_a_smaller_batch():
  """The TPU compiler's VMEM refusal (a Pallas kernel's scoped scratch) names the tiles, not HBM
  (the message the fused DAPE kernel got at 256 x 256 tiles before they were capped)."""
  from bipe_jax.compile import report as report_lib  # pylint: disable=import-outside-toplevel
  refused = report_lib.StepFigures(
      name='train', argument_bytes=0, output_bytes=0, alias_bytes=0, temp_bytes=0,
      generated_code_bytes=0, flops=0.0, model_flops=0.0, collectives={}, compile_seconds=1.0,
      out_of_memory='RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Ran out of memory in '
                    'memory space vmem while allocating on stack for %branch_0_fun.5')
  summary = dict(block_size=256, batch_size=256, grad_accum_steps=1, remat='full',
                 dtype='bfloat16')
  report = report_lib.CompileReport(
      topology='v5e:2x4', num_slices=1, device_kind='TPU v5 lite', num_devices=8,
      mesh=dict(data=8, fsdp=1, context=1, tensor=1), hbm_bytes=16 * 2**30, param_bytes=2**30,
      optimizer_bytes=2**31, steps=[refused], config_summary=summary)
  advice = report_lib.fit_advice(report)
  assert 'VMEM' in advice and 'model.block_size < 256' in advice, advice
  assert 'batch' not in advice and 'GiB' not in advice, advice
  summary['block_size'] = 128
  refused.out_of_memory = 'RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. 20.1G'
  assert 'smaller per-chip batch' in report_lib.fit_advice(report)
