"""train/compile.py --platform=cuda: GPU targets, deviceless compile, and the lowering fallback."""

import os
import sys

import pytest

from bipe_jax.compile import cli as compile_cli
from bipe_jax.compile import gpu_lowering
from bipe_jax.compile import gpu_targets
from bipe_jax.compile import topologies
from configs import tiny
from tests import fixtures
from tests import forkserver

ROOT = fixtures.ROOT
PLUGIN = os.path.join(ROOT, '.venv', 'cuda-plugin')


@pytest.mark.parametrize('name, hosts, per_host, gpu', [
    ('h100:8', 1, 8, 'h100'), ('H200:2x8', 2, 8, 'h200'), ('a100:1', 1, 1, 'a100')])
def test_parse_topology(name, hosts, per_host, gpu):
  topology = gpu_targets.parse_topology(name)
  assert (topology.hosts, topology.devices_per_host, topology.target.name) == (hosts, per_host, gpu)
  assert topology.num_devices == hosts * per_host
  assert topology.xla_shape == f'1x{hosts}x{per_host}'


@pytest.mark.parametrize('name, says', [('v5e:2x4', "unknown GPU 'v5e'"), ('h100', 'not a GPU topology'),
                                        ('b200:8', "unknown GPU 'b200'"),
                                        ('h100:0', 'must be >= 1')])
def test_parse_topology_refuses_in_one_line(name, says):
  with pytest.raises(gpu_targets.GpuTopologyError, match=says) as info:
    gpu_targets.parse_topology(name)
  assert '\n' not in str(info.value)


def test_local_topology_refuses_without_a_gpu():
  """--topology=local names this host's GPUs; on the CPU test host JAX sees none."""
  with pytest.raises(gpu_targets.GpuTopologyError, match='JAX sees none here') as info:
    gpu_targets.gpu_devices('local')
  assert '\n' not in str(info.value)


def test_target_config_carries_the_card():
  h100 = gpu_targets.GPU_TARGETS['h100']
  text = h100.target_config()
  assert 'cuda_compute_capability { major: 9 minor: 0 }' in text
  assert f'core_count: {h100.sm_count}' in text and 'device_memory_size: 80000000000' in text
  assert topologies.hbm_bytes('NVIDIA H100 80GB HBM3') == 80 * 10 ** 9
  assert topologies.hbm_bytes('TPU v5 lite') == 16 * topologies.GIB  # TPU kinds unchanged


def test_summarize_names_the_attention_that_ran():
  text = '\n'.join([
      '%0 = stablehlo.dot_general %a, %b', '%1 = stablehlo.dot_general %c, %d',
      '%2 = stablehlo.custom_call @__cudnn$fmhaSoftmax(%x)', '%3 = "stablehlo.all_reduce"(%y)',
      '%4 = stablehlo.while(%z)'])
  summary = gpu_lowering.summarize(text)
  assert summary['ops'] == {'dot_general': 2, 'custom_call': 1, 'all-reduce': 1,
                            'while (scans, blockwise loops)': 1}
  assert summary['custom_calls'] == {'__cudnn$fmhaSoftmax': 1}
  assert summary['attention'] == 'cuDNN fused attention'
  assert gpu_lowering.summarize('stablehlo.dot_general')['attention'].startswith('XLA')


def test_one_device_share():
  config = tiny.get_config()
  with config.unlocked():
    config.mesh.fsdp = 4
  share = gpu_lowering.one_device_share(config, 8)
  assert share.train.batch_size == config.train.batch_size // 8
  assert (share.mesh.data, share.mesh.fsdp, share.model.kernels) == (1, 1, 'portable')
  assert config.mesh.fsdp == 4  # the caller's config is not edited


def test_lowering_fallback_prints_summary_and_why(monkeypatch, capsys):
  """Without the CUDA plugin: the step is lowered for CUDA, summarised, exit code 3."""
  monkeypatch.setattr(gpu_targets, 'lower_only_reason', lambda: 'no plugin here')
  config = tiny.get_config()
  with config.unlocked():
    config.model.num_layers = 1
    config.model.attention_impl = 'blockwise'
  code = compile_cli.run(config, 'h100:4', platform='cuda')
  out, err = capsys.readouterr()
  assert code == compile_cli.LOWERED_ONLY
  assert 'train: lowered for CUDA (not compiled)' in out
  assert 'dot_general' in out and 'while' in out  # blockwise attention's loops
  assert err.strip() == 'not compiled: no plugin here'


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(PLUGIN), reason='needs make setup-cuda (.venv/cuda-plugin)')
def test_compile_cli_compiles_for_h100_without_a_gpu(tmp_path):
  """The real training step, compiled by XLA's GPU compiler for 2 H100s on this CPU host."""
  output = tmp_path / 'figures.json'
  proc = forkserver.run(
      [sys.executable, 'train/compile.py', '--config=configs/tiny.py', '--platform=cuda',
       '--topology=h100:2', '--config.mesh.data=2', '--config.model.num_layers=1',
       '--config.train.batch_size=4', f'--output={output}'],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert '2 x NVIDIA H100 80GB HBM3' in proc.stdout
  import json  # pylint: disable=import-outside-toplevel
  figures = json.loads(output.read_text())
  train = figures['steps'][0]
  assert figures['fits'] and figures['num_devices'] == 2
  assert train['argument_bytes'] > 0 and train['temp_bytes'] > 0
  assert train['collectives']['all-reduce']['ops'] >= 1  # data-parallel gradient reduction


def test_no_topology_on_a_gpu_platform_asks_for_one(capsys):
  """Without --topology a TPU compile uses v5e:2x4; a GPU compile gets no TPU name (the
  `unknown GPU 'v5e'` of old) but one line asking for a GPU topology, exit 2."""
  assert compile_cli.resolve_topology('', 'tpu') == compile_cli.DEFAULT_TPU_TOPOLOGY == 'v5e:2x4'
  assert compile_cli.resolve_topology('h100:8', 'cuda') == 'h100:8'
  assert compile_cli.resolve_topology('v4:2x2x1', 'tpu') == 'v4:2x2x1'
  with pytest.raises(topologies.CompileError, match='--platform=cuda needs --topology=GPU:COUNT'):
    compile_cli.resolve_topology('', 'cuda')
  assert compile_cli.run(tiny.get_config(), '', platform='cuda') == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'h100:8' in err and 'v5e' not in err, err
  # the command line of the issue: the flag's default is no topology
  proc = forkserver.run([sys.executable, 'train/compile.py',
                         '--config=configs/paper_151m.py:bipe_alibi', '--platform=cuda'],
                        cwd=ROOT, env=fixtures.cpu_env(), capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert proc.stderr.strip() == ('error: --platform=cuda needs --topology=GPU:COUNT or '
                                 'GPU:HOSTSxCOUNT (e.g. ' + compile_cli.GPU_TOPOLOGY_EXAMPLES + ')')
