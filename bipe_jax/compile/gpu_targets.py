"""GPU targets for ahead-of-time compiles on a host without a GPU (`train/compile.py --platform=cuda`).

XLA's GPU compiler needs a description of the card it compiles for. On a GPU host it reads one
from the driver; without a GPU the CUDA PJRT plugin (requirements-cuda.txt) builds compile-only
devices from a `GpuTargetConfigProto` text given as `target_config`, and a topology string
'<slices>x<hosts per slice>x<devices per host>':

    devices = gpu_devices('h100:8')       # one host of 8 H100s
    devices = gpu_devices('h200:2x8')     # 2 hosts x 8 H200s

The descriptions below are the cards' public data sheet figures (compute capability, SMs, shared
memory, L2, memory size and bandwidth, SM clock), written as XLA's text format. XLA uses them to
choose fusions and tile sizes and to check that the program fits the card's memory; the
compiled program's per-device bytes (`memory_analysis`) are exact for that card.

Without the plugin, `lowering_platforms=('cuda',)` still lowers a program for CUDA on a CPU-only
jaxlib (StableHLO before XLA's GPU passes): `lower_only_reason` says why a compile was not
possible, and train/compile.py prints the lowered program's summary instead.
"""

import dataclasses
import importlib.util
import re
from typing import Optional

GIB = 1024 ** 3
CUDA_PLUGINS = ('jax_cuda12_plugin', 'jax_cuda13_plugin')  # either builds compile-only devices


@dataclasses.dataclass(frozen=True)
class GpuTarget:
  """One GPU model: what XLA's compiler needs, and what the report compares against."""
  name: str  # the --topology prefix: 'h100', 'h200', 'a100'
  device_name: str  # what the device reports as device_kind
  compute_capability: tuple  # (major, minor)
  sm_count: int
  shared_memory_per_sm: int  # bytes
  shared_memory_per_block_optin: int  # bytes
  l2_cache_bytes: int
  memory_bytes: int
  memory_bandwidth: int  # bytes / s
  clock_ghz: float

  def target_config(self) -> str:
    """The `GpuTargetConfigProto` text XLA's GPU compiler reads in place of a driver query."""
    major, minor = self.compute_capability
    return (
        'gpu_device_info {\n'
        '  threads_per_block_limit: 1024\n  threads_per_warp: 32\n'
        '  shared_memory_per_block: 49152\n'
        f'  shared_memory_per_core: {self.shared_memory_per_sm}\n'
        '  threads_per_core_limit: 2048\n'
        f'  core_count: {self.sm_count}\n  fpus_per_core: 128\n'
        '  block_dim_limit_x: 2147483647\n  block_dim_limit_y: 65535\n'
        '  block_dim_limit_z: 65535\n'
        f'  memory_bandwidth: {self.memory_bandwidth}\n'
        f'  l2_cache_size: {self.l2_cache_bytes}\n'
        f'  clock_rate_ghz: {self.clock_ghz}\n'
        f'  device_memory_size: {self.memory_bytes}\n'
        f'  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}\n'
        f'  cuda_compute_capability {{ major: {major} minor: {minor} }}\n'
        '  registers_per_core_limit: 65536\n  registers_per_block_limit: 65536\n'
        '}\n'
        'platform_name: "CUDA"\n'
        'dnn_version_info { major: 9 minor: 10 patch: 0 }\n'
        f'device_description_str: "{self.device_name}"\n')


# Data-sheet figures (NVIDIA H100 SXM5 80 GB, H200 SXM 141 GB, A100 SXM4 80 GB).
GPU_TARGETS = {
    t.name: t for t in (
        GpuTarget('h100', 'NVIDIA H100 80GB HBM3', (9, 0), 132, 233472, 232448, 50 * 2 ** 20,
                  80 * 10 ** 9, 3_350 * 10 ** 9, 1.98),
        GpuTarget('h200', 'NVIDIA H200', (9, 0), 132, 233472, 232448, 50 * 2 ** 20,
                  141 * 10 ** 9, 4_800 * 10 ** 9, 1.98),
        GpuTarget('a100', 'NVIDIA A100-SXM4-80GB', (8, 0), 108, 167936, 166912, 40 * 2 ** 20,
                  80 * 10 ** 9, 2_039 * 10 ** 9, 1.41),
    )
}

_TOPOLOGY = re.compile(r'^([a-z0-9]+):(?:(\d+)x)?(\d+)$')


class GpuTopologyError(ValueError):
  """A GPU topology string or environment this module cannot compile for (one line)."""


@dataclasses.dataclass(frozen=True)
class GpuTopology:
  target: GpuTarget
  hosts: int
  devices_per_host: int

  @property
  def num_devices(self) -> int:
    return self.hosts * self.devices_per_host

  @property
  def xla_shape(self) -> str:
    """The CUDA plugin's topology string: slices x hosts x devices per host."""
    return f'1x{self.hosts}x{self.devices_per_host}'


def parse_topology(name: str) -> GpuTopology:
  """'h100:8' (one host of 8) or 'h200:2x8' (2 hosts of 8) -> GpuTopology; one-line error."""
  match = _TOPOLOGY.match(name.strip().lower())
  known = ', '.join(sorted(GPU_TARGETS))
  if not match:
    raise GpuTopologyError(f'--topology={name!r} is not a GPU topology: write GPU:COUNT or '
                           f'GPU:HOSTSxCOUNT with GPU one of {known} (e.g. h100:8, h200:2x8)')
  gpu, hosts, count = match.group(1), int(match.group(2) or 1), int(match.group(3))
  if gpu not in GPU_TARGETS:
    raise GpuTopologyError(f'--topology={name!r}: unknown GPU {gpu!r}; known: {known}')
  if hosts < 1 or count < 1:
    raise GpuTopologyError(f'--topology={name!r}: hosts and devices per host must be >= 1')
  return GpuTopology(GPU_TARGETS[gpu], hosts, count)


LOCAL = 'local'  # --topology=local: this host's own GPUs, as JAX sees them


def lower_only_reason() -> Optional[str]:
  """None when the CUDA plugin can build compile-only GPU devices here, else why not (one line)."""
  if not any(importlib.util.find_spec(plugin) for plugin in CUDA_PLUGINS):
    return ('the CUDA PJRT plugin is not installed (make setup-cuda, or pip install -r '
            'requirements-cuda.txt), so XLA\'s GPU compiler is not available on this host')
  return None


def local_gpus() -> list:
  """This host's GPUs (`--topology=local`: the compile reads the card from the driver, which
  checks the data-sheet descriptions below). Raises GpuTopologyError when JAX sees none."""
  import jax  # pylint: disable=import-outside-toplevel
  try:
    devices = jax.devices('cuda')
  except RuntimeError:
    devices = []
  if not devices:
    raise GpuTopologyError(f'--topology={LOCAL} compiles for this host\'s own GPUs, and JAX sees '
                           'none here; name a GPU target instead, e.g. h100:8')
  return devices


def gpu_devices(name: str) -> list:
  """Compile-only devices of GPU topology `name` ('h100:8', ...), or with 'local' this host's
  GPUs. Raises GpuTopologyError."""
  if name.strip().lower() == LOCAL:
    return local_gpus()
  topology = parse_topology(name)
  reason = lower_only_reason()
  if reason:
    raise GpuTopologyError(reason)
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  try:
    desc = topologies.get_topology_desc(
        topology_name='', platform='cuda', topology=topology.xla_shape,
        target_config=topology.target.target_config())
  except Exception as e:  # pylint: disable=broad-except (jaxlib raises its own types)
    detail = ' '.join(str(e).split())[:300]
    raise GpuTopologyError(f'--topology={name}: the CUDA plugin could not describe it: '
                           f'{detail}') from None
  return list(desc.devices)


def target_for_device_kind(device_kind: str) -> Optional[GpuTarget]:
  kind = device_kind.lower()
  for target in GPU_TARGETS.values():
    if target.device_name.lower() == kind or target.name in kind:
      return target
  return None

