"""Ahead-of-time compilation for TPU (compile/aot.py, train/compile.py) on this CPU host.

Tiny models (1 layer, width 64, 16 tokens) compiled for a v5e:2x2 topology by libtpu: every
encoding family once, the meshes spread over them so that data, fsdp and tensor axes are each
compiled; figures checked against values computed independently (parameter count x bytes /
shards), collectives against what each mesh must need.
"""

import json
import os
import re
import sys

import jax
import pytest

from bipe_jax import config as config_lib
from bipe_jax import model as model_lib
from bipe_jax import schemes
from bipe_jax.compile import aot as aot_compile
from bipe_jax.compile import cli as compile_cli
from bipe_jax.compile import hlo_stats
from bipe_jax.compile import report as report_lib
from bipe_jax.compile import topologies
from configs import tiny
from tests import fixtures
from tests import forkserver

pytest.importorskip('libtpu', reason='the TPU compiler (requirements-tpu.txt) is not installed')

ROOT = fixtures.ROOT
TOPOLOGY = 'v5e:2x2'


def tiny_config(encoding='bipe_rope', mesh=(4, 1, 1), **model):
  config = tiny.get_config()
  m = config.model
  m.position_encoding = encoding
  m.num_layers, m.hidden_size, m.num_heads, m.ffn_size, m.vocab_size = 1, 64, 4, 128, 256
  m.max_intra = m.max_position = m.block_size = m.train_length = 16
  for key, value in model.items():
    m[key] = value
  config.data.seq_len = 16
  config.train.batch_size = 8
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
  return config


def param_count(config) -> int:
  return model_lib.count_params(config_lib.model_config_from_dict(config.model,
                                                                  require_separators=False))


# Each family once (rope, alibi, kerple, fire, t5, dape v1 / v2, bipe); each mesh axis > 1 in
# several of them: data x fsdp, pure data, pure fsdp, tensor with data, fsdp x tensor.
CASES = [
    ('bipe_rope', (2, 2, 1)),
    ('rope', (2, 1, 2)),
    ('alibi', (4, 1, 1)),
    ('bipe_alibi', (1, 4, 1)),
    ('dape_fire', (1, 2, 2)),  # FIRE bias + DAPE V1
    ('dapev2_kerple', (2, 1, 2)),  # Kerple bias + DAPE V2
    ('t5', (1, 2, 2)),
]


@pytest.mark.slow  # compiles for TPU: make test, not make test-fast
@pytest.mark.parametrize('encoding,mesh', CASES)
def test_tiny_model_compiles_for_tpu(encoding, mesh):
  config = tiny_config(encoding, mesh)
  report = aot_compile.compile_for_topology(config, TOPOLOGY)
  step = report.steps[0]
  assert report.device_kind == 'TPU v5 lite' and report.num_devices == 4
  assert report.mesh == {'data': mesh[0], 'fsdp': mesh[1], 'context': 1, 'tensor': mesh[2]}
  assert report.hbm_bytes == 16 * topologies.GIB and report.fits()
  n = param_count(config)
  data, fsdp, tensor = mesh
  if fsdp == tensor == 1:  # replicated: every chip holds all float32 parameters
    assert report.param_bytes == 4 * n
  else:  # sharded: less than all of them, at least an even share
    assert 4 * n / (fsdp * tensor) <= report.param_bytes < 4 * n
  # AdamW: mu and nu shaped like the parameters (plus scalar counts)
  assert 2 * report.param_bytes <= report.optimizer_bytes <= 2 * report.param_bytes + 64
  # the donated state is written in place: outputs alias the state's arguments
  assert step.alias_bytes >= report.param_bytes + report.optimizer_bytes
  assert step.argument_bytes >= report.param_bytes + report.optimizer_bytes
  assert step.total_bytes >= step.argument_bytes
  # model FLOPs per chip: at least 6 * params * tokens / chips; XLA's count of the program
  # (one layer, one attention block, one loss chunk: no loop to undercount) agrees within 2x
  tokens = config.train.batch_size * config.data.seq_len
  tables = 256 * 64 + (16 * 64 if schemes.get_scheme(encoding).bilevel else 0)  # looked up, not multiplied
  assert step.model_flops >= 0.95 * 6 * (n - tables) * tokens / 4
  assert 0.5 < step.flops / step.model_flops < 2
  kinds = step.collectives
  assert kinds['all-reduce']['ops'] >= 1  # gradients over the batch shards, the loss
  if fsdp == tensor == 1:
    assert 'all-gather' not in kinds and 'reduce-scatter' not in kinds
  if fsdp > 1:  # weights gathered before use, gradients reduce-scattered back
    assert kinds['all-gather']['ops'] >= 2 and kinds['reduce-scatter']['arrays'] >= 1
  assert step.compile_seconds > 0


@pytest.mark.slow  # compiles for TPU: make test, not make test-fast
def test_fsdp_gradients_of_every_matrix_are_reduce_scattered():
  """MaxText's FSDP layout: each weight matrix's gradient leaves the step reduce-scattered (each
  chip receives its shard), none all-reduced at full size; only the replicated norm scales
  and scalars are all-reduced. Width 512, head_dim 64 over fsdp=4 (the 151M preset's
  head_dim; at head_dim 32 and 64-row shards the TPU compiler lays the embed axis of the
  attention gradients along the 128-lane tile and all-reduces them instead:
  benchmarks/README.md, "Collectives of the TPU program"). Float32 compute: in bfloat16 on
  this small slice XLA all-reduces the attention gradients in bfloat16 instead (on the 1.2B
  preset's v5e:4x4 it reduce-scatters them by collective matmuls: same section)."""
  config = tiny_config('rope', (1, 4, 1), hidden_size=512, num_heads=8, ffn_size=1024,
                       vocab_size=512, scan_layers=True, num_layers=2)
  step = aot_compile.compile_for_topology(config, TOPOLOGY, keep_text=True).steps[0]
  # q, k, v, o; gate, up, down; lm head (the embedding's gradient is a scatter-add, which XLA
  # routes otherwise: the check below only requires that it is not all-reduced at full size)
  matrices = 4 + 3 + 1
  assert step.collectives['reduce-scatter']['arrays'] >= matrices
  # full-size all-reduces: those outside the all-reduce-scatter fusions
  shapes, fusion = [], False
  for line in step.text['compiled'].splitlines():
    if line and not line[0].isspace():
      fusion = line.startswith('%all-reduce-scatter')
    elif ' all-reduce(' in line and not fusion:
      result = line.split('=', 1)[1].split(' all-reduce(')[0]
      shapes += re.findall(r'(?:f32|bf16)\[([\d,]*)\]', result)
  assert shapes and all(',' not in s for s in shapes), shapes  # vectors and scalars only


@pytest.mark.slow  # compiles for TPU: make test, not make test-fast
def test_eval_step_and_cli_table_and_json(tmp_path, capsys):
  out = tmp_path / 'figures.json'
  # (a mesh no other test compiles: JAX's persistent cache, which the suite shares, stores a
  # TPU executable it cannot load back on this host, and warns)
  code = compile_cli.run(tiny_config('bipe_rope', (1, 2, 2)), TOPOLOGY, eval_lengths=['32'],
                         eval_batch_size=2, output=str(out))
  printed = capsys.readouterr()
  assert code == 0, printed.err
  assert printed.err == ''
  # a line before the (long) compile, then the table
  assert printed.out.startswith('compiling the training step and the evaluation forward at 32 '
                                f'for {TOPOLOGY} (')
  assert 'scan_layers False, attention pallas\n' in printed.out  # 'auto' on a TPU topology
  for label in ('parameters', 'optimizer state', 'temporaries', 'total', 'HBM', 'fits',
                'model TFLOPs per step', 'all-gather (ops / arrays)', 'compile time', 'eval@32'):
    assert label in printed.out, label
  figures = json.loads(out.read_text())
  train, evaluation = figures['steps']
  assert figures['fits'] and train['name'] == 'train' and evaluation['name'] == 'eval@32'
  assert {'temp_bytes', 'argument_bytes', 'total_bytes', 'flops', 'collectives'} <= set(train)
  assert evaluation['alias_bytes'] == 0  # nothing donated: parameters are read, not updated
  assert evaluation['argument_bytes'] < train['argument_bytes']  # no optimizer state
  # eval batch 2 (a multiple of the 2 batch shards) x 32 tokens over 4 chips: about
  # 2 * params * tokens / chips, in XLA's count and the model's
  assert evaluation['flops'] >= 2 * param_count(tiny_config()) * 2 * 32 / 4 * 0.5
  assert 0.5 < evaluation['flops'] / evaluation['model_flops'] < 2


def test_a_step_that_cannot_fit_exits_1_with_one_line(capsys):
  # 2M x 1024 float32 embedding and head: 15 GiB of parameters per chip, replicated (data=4)
  config = tiny_config('rope', (4, 1, 1), vocab_size=2_000_000, hidden_size=1024,
                       num_heads=8, ffn_size=256)
  code = compile_cli.run(config, TOPOLOGY)
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 1
  assert len(err) == 1 and err[0].startswith('error: does not fit: the train step needs ')
  assert 'mesh.fsdp=4' in err[0] and "model.dtype='bfloat16'" in err[0]
  assert "model.remat='full'" in err[0]


def test_bad_topology_is_one_line_without_libtpu_noise():
  proc = forkserver.run(
      [sys.executable, 'train/compile.py', '--config=configs/tiny.py', '--topology=v9z:3x3'],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env={k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'})
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: --topology=v9z:3x3'), proc.stderr
  assert proc.stdout == ''


def test_a_topology_no_mesh_fits_is_one_line(capsys):
  # v4:2x2 names 8 devices (2 cores per chip) that jax's mesh tiling refuses with an assertion
  assert compile_cli.run(tiny_config('rope', (8, 1, 1)), 'v4:2x2') == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: --topology=v4:2x2: no device mesh')
  assert 'v4:2x2x1' in err[0]


HLO = """\
%all-reduce-scatter.3 (input_0: f32[8,4], input_1: f32[4]) -> (f32[4,4], f32[2]) {
  %all-reduce.1 = (f32[8,4]{1,0}, f32[4]{0}) all-reduce(%input_0, %input_1), channel_id=5, replica_groups={{0,1}}
}

%all-reduce-scatter.4 (input_0: f32[8,4]) -> f32[4,4] {
  %all-reduce.2 = f32[8,4]{1,0} all-reduce(%input_0), channel_id=5, replica_groups={{0,1}}
}

%async_collective_fusion.1 (p: bf16[4,2]) -> bf16[4,4] {
  %all-gather.7 = bf16[4,4]{1,0:T(8,128)} all-gather(%p), channel_id=9, dimensions={1}
}

%async_collective_fusion.2 (p: bf16[4,2]) -> bf16[4,4] {
  %all-gather.8 = bf16[4,4]{1,0:T(8,128)} all-gather(%p), channel_id=9, dimensions={1}
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %all-gather-start.2 = (f32[2], f32[4]) all-gather-start(%x), channel_id=11, dimensions={0}
  %all-gather-done.2 = f32[4] all-gather-done(%all-gather-start.2)
  %all-reduce.9 = f32[] all-reduce(%s), channel_id=12, to_apply=%add
  %cp = s32[2]{0} collective-permute(%y), channel_id=13, source_target_pairs={{0,1}}
  %n = f32[4] add(%a, %a), metadata={op_name="all-gather(fake)"}
}
"""


def test_count_collectives_by_channel_and_kind():
  counts = hlo_stats.count_collectives(HLO)
  # channel 9 printed twice (async pieces) is one all-gather; -start counted, -done not
  assert counts['all-gather'] == {'ops': 2, 'arrays': 3}
  # inside all-reduce-scatter fusions: one per fusion, though both print channel 5
  assert counts['reduce-scatter'] == {'ops': 2, 'arrays': 3}
  assert counts['all-reduce'] == {'ops': 1, 'arrays': 1}
  assert counts['collective-permute'] == {'ops': 1, 'arrays': 1}
  assert 'all-to-all' not in counts


def test_required_bytes_and_hbm_table():
  assert hlo_stats.required_bytes('required for HLO temporaries (27.87G) exceeds available '
                                    'HBM (15.75G)') == int(27.87 * 2 ** 30)
  assert hlo_stats.required_bytes('Used 512.5M of 16G hbm') == int(512.5 * 2 ** 20)
  assert hlo_stats.required_bytes('no size here') == 0
  gib = topologies.GIB
  assert [topologies.hbm_bytes(k) for k in ('TPU v5 lite', 'TPU v5', 'TPU v4', 'TPU v6 lite',
                                             'cpu')] == [16 * gib, 95 * gib, 32 * gib,
                                                         32 * gib, 0]


def test_shard_bytes_counts_one_devices_share():
  mesh = jax.make_mesh((1,), ('fsdp',), devices=jax.devices()[:1])
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  tree = {'a': jax.ShapeDtypeStruct((3, 5), 'float32'), 'b': jax.ShapeDtypeStruct((7,),
                                                                                 'bfloat16')}
  assert hlo_stats.shard_bytes(tree, {'a': sharding, 'b': sharding}) == 3 * 5 * 4 + 7 * 2


@pytest.mark.slow  # compiles for TPU: make test, not make test-fast
def test_the_tpu_program_takes_the_portable_path():
  """model.kernels='auto' resolves to 'portable' for TPU devices: RoPE's sin / cos computed in
  the program (the CPU path gathers host tables) and fewer optimization barriers (the CPU path
  adds its own to the attention backward and the RoPE tables; the ones left come from
  jax.checkpoint). An explicit 'cpu' is the control."""
  def primitives(kernels):
    config = tiny_config('bipe_rope', (4, 1, 1), kernels=kernels)
    report = aot_compile.compile_for_topology(config, TOPOLOGY, keep_text=True)
    assert report.config_summary['kernels'] == kernels
    pairs = report.steps[0].text['primitives'].split(',')
    return {k: int(v) for k, v in (p.split('=') for p in pairs)}
  portable, cpu = primitives('auto'), primitives('cpu')
  assert portable.get('sin', 0) >= 1 and portable.get('cos', 0) >= 1
  assert 'sin' not in cpu and 'cos' not in cpu
  assert portable.get('optimization_barrier', 0) < cpu['optimization_barrier']


@pytest.mark.slow  # compiles for TPU: make test, not make test-fast
def test_two_slices_put_the_data_axis_across_them():
  config = tiny_config('rope', (2, 4, 1))
  report = aot_compile.compile_for_topology(config, TOPOLOGY, num_slices=2)
  assert report.num_devices == 8 and report.mesh == {'data': 2, 'fsdp': 4, 'context': 1,
                                                     'tensor': 1}
  assert report.fits()
  with pytest.raises(topologies.CompileError, match=r'mesh.data \(1\) must be a multiple'):
    aot_compile.compile_for_topology(tiny_config('rope', (1, 8, 1)), TOPOLOGY, num_slices=2)
