"""The process set-up of a CPU run, chosen by the same setting as the compute forms.

`setup_process(kernels, cpu_devices)` runs first thing in an entry point, before JAX starts
its backend. It resolves `model.kernels` for the platform the process will run on
(`expected_platform`, judged without starting JAX) and, on the cpu path, keeps freed host
memory in the process (host_malloc.py) and splits the CPU host into `cpu_devices`
single-threaded JAX devices (cpu_devices.py). On the portable path it changes nothing.
"""

import os

from bipe_jax import kernels
from bipe_jax.kernels import cpu_devices as cpu_devices_lib
from bipe_jax.kernels import host_malloc

_GPU_PLATFORM_NAMES = ('cuda', 'rocm', 'gpu')


def expected_platform(environ=None) -> str:
  """'cpu' | 'gpu' | 'tpu' | ...: the platform JAX will run on, judged before it starts.

  The first platform of JAX_PLATFORMS (environment or jax.config) when set; otherwise 'tpu'
  when TPU chips are attached, 'gpu' when an NVIDIA GPU is visible, else 'cpu'.
  """
  environ = os.environ if environ is None else environ
  import jax  # pylint: disable=import-outside-toplevel
  chosen = environ.get('JAX_PLATFORMS') or jax.config.jax_platforms or ''
  first = chosen.split(',')[0].strip().lower()
  if first:
    return 'gpu' if first in _GPU_PLATFORM_NAMES else first
  from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
  if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
    return 'tpu'
  return 'gpu' if hardware_utils.has_visible_nvidia_gpu() else 'cpu'


def setup_process(kernels_name: str = 'auto', cpu_devices: int = 1, environ=None) -> str:
  """Applies the CPU process set-up when `kernels_name` resolves to 'cpu' here; returns the
  resolved path ('cpu' | 'portable').

  cpu: host_malloc.keep_freed_memory() and cpu_devices.use_cpu_devices(cpu_devices) (which
  raises CpuDevicesError for a bad count or when JAX already started). portable: nothing; a
  `cpu_devices` > 1 is inert off CPU (a GPU / TPU host) and an error with an explicit
  kernels='portable' on a CPU host (the split serves the cpu path).
  """
  platform = expected_platform(environ)
  resolved = kernels.resolve_kernels(kernels_name, platform)
  if resolved == 'cpu':
    host_malloc.keep_freed_memory(environ)
    cpu_devices_lib.use_cpu_devices(cpu_devices, environ)
  elif platform == 'cpu' and cpu_devices != 1:
    raise cpu_devices_lib.CpuDevicesError(
        f"--cpu_devices={cpu_devices} splits a CPU host for model.kernels='cpu' (or 'auto'), "
        f"but model.kernels={kernels_name!r}: drop --cpu_devices or choose those kernels")
  return resolved
