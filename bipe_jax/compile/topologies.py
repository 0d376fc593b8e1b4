"""TPU topologies described on any host (libtpu, no TPU attached), GPU ones through the CUDA plugin
(gpu_targets.py), and the memory of each device kind.

`topology_devices('v5e:2x4')` gives the devices of a slice for an ahead-of-time compile
(compile/aot.py); `hbm_bytes(device_kind)` the memory of one of them.
"""

import contextlib
import os
import tempfile

from bipe_jax.compile import gpu_targets

GIB = 1024 ** 3

# HBM per JAX TPU device, by device_kind (first substring match wins, most specific first).
# v4 and v5p: one device per chip (megacore, both TensorCores). Sources: Cloud TPU system
# architecture pages of each generation.
HBM_BYTES_BY_KIND = (
    ('v6 lite', 32 * GIB),  # Trillium / v6e
    ('v5 lite', 16 * GIB),  # v5e
    ('v5p', 95 * GIB),
    ('v5', 95 * GIB),  # v5p reports device_kind 'TPU v5'
    ('v4', 32 * GIB),
    ('v3', 16 * GIB),  # per device (one TensorCore); 32 GiB per chip
    ('v2', 8 * GIB),
)


class CompileError(ValueError):
  """A topology or config this module cannot compile; the message is one line."""


def hbm_bytes(device_kind: str) -> int:
  """HBM of one device of `device_kind` (e.g. 'TPU v5 lite', 'NVIDIA H100 80GB HBM3'), 0 when
  unknown."""
  gpu = gpu_targets.target_for_device_kind(device_kind)
  if gpu is not None:
    return gpu.memory_bytes
  kind = device_kind.lower()
  for name, size in HBM_BYTES_BY_KIND:
    if name in kind:
      return size
  return 0


@contextlib.contextmanager
def stderr_to_file():
  """Sends file descriptor 2 to a temporary file for the block; yields a reader of it.

  libtpu writes its initialisation warnings (no TPU attached, no worker hostnames) from C++
  straight to fd 2 while it describes a topology; Python's sys.stderr cannot hold them back.
  """
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode='w+b') as capture:
    os.dup2(capture.fileno(), 2)
    try:
      yield lambda: (capture.seek(0), capture.read().decode(errors='replace'))[1]
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def topology_devices(name: str, num_slices: int = 1) -> list:
  """The TPU devices of topology `name` ('v5e:2x4', 'v4:2x2x1', ...) over `num_slices` slices.

  Raises CompileError (one line) when libtpu is missing or does not know the name.
  """
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  # libtpu takes a host-wide lock file (/tmp/libtpu_lockfile) for the TPU chips it would own;
  # compiling owns no chip, so several compiles (or users) on one host must not exclude each
  # other. Read when libtpu loads, i.e. at the first topology request of the process.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  kwargs = {'num_slices': num_slices} if num_slices > 1 else {}
  with stderr_to_file() as libtpu_output:
    try:
      topology = topologies.get_topology_desc(platform='tpu', topology_name=name, **kwargs)
    except Exception as e:  # pylint: disable=broad-except (jaxlib raises its own types)
      detail = ' '.join(str(e).split())[:300]
      if 'Unknown backend' in detail or 'tpu' in detail.lower() and 'plugin' in detail.lower():
        raise CompileError(f'--topology={name}: the TPU compiler is not installed (pip install '
                           f'-r requirements-tpu.txt); {detail}') from None
      raise CompileError(f'--topology={name} (num_slices={num_slices}) is not a TPU topology '
                         f'libtpu knows (e.g. v5e:2x4, v4:2x2x1, v5p:2x2x1): {detail}') from None
    del libtpu_output
  return list(topology.devices)


def platform_devices(platform: str, topology: str, num_slices: int = 1) -> list:
  """Compile-only devices of `topology` on `platform` ('tpu' | 'cuda'); CompileError (one line)."""
  if platform == 'tpu':
    return topology_devices(topology, num_slices)
  if platform != 'cuda':
    raise CompileError(f"--platform={platform!r} must be 'tpu' or 'cuda'")
  if num_slices != 1:
    raise CompileError('--num_slices applies to TPU slices; write GPU hosts as h100:HOSTSx8')
  try:
    return gpu_targets.gpu_devices(topology)
  except gpu_targets.GpuTopologyError as e:
    raise CompileError(str(e)) from None
