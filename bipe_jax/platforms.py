"""Choose JAX's CPU platform on a host without an accelerator, before JAX starts.

With the `libtpu` wheel installed (requirements-tpu.txt, for compiling TPU programs on any
host), JAX's default platform search tries the TPU backend first; on a host with no TPU that
prints several lines of libtpu initialisation errors and only then falls back to the CPU.
Importing the `bipe_jax` package (any of its modules) calls `use_cpu_without_accelerator()`, and
so do the entry points: when JAX_PLATFORMS is unset and the host has no TPU or GPU, it sets
JAX_PLATFORMS=cpu, so a CPU program starts quietly. Nothing is set
- on a TPU VM (/dev/accel* or /dev/vfio devices, Google's TPU PCI vendor id, or a TPU_*
  variable of TPU_ENVIRONMENT set) or a GPU host (/dev/nvidia*, ROCm's /dev/kfd, WSL's /dev/dxg):
  JAX picks the accelerator as usual;
- when JAX_PLATFORMS is set (a user's choice always wins; JAX_PLATFORMS=tpu,cpu restores JAX's
  own search);
- when JAX already created its backends (the user queried devices before importing bipe_jax).
JAX reads the variable when it is imported, so when it already is, its `jax_platforms` setting
is updated too.
"""

import glob
import os
import sys

PLATFORMS_VARIABLE = 'JAX_PLATFORMS'
GOOGLE_PCI_VENDOR = '0x1ae0'  # TPU chips on the PCI bus of a TPU VM
TPU_DEVICE_PATTERNS = ('/dev/accel*', '/dev/vfio/[0-9]*')
ACCELERATOR_DEVICE_PATTERNS = TPU_DEVICE_PATTERNS + ('/dev/nvidia[0-9]*', '/dev/nvidiactl',
                                                     '/dev/kfd', '/dev/dxg')
# Set by Cloud TPU VMs / GKE TPU pods (and users pointing libtpu at chips): a TPU is meant.
TPU_ENVIRONMENT = ('TPU_NAME', 'TPU_ACCELERATOR_TYPE', 'TPU_WORKER_ID', 'TPU_WORKER_HOSTNAMES',
                   'TPU_VISIBLE_CHIPS', 'TPU_PROCESS_BOUNDS', 'TPU_CHIPS_PER_PROCESS_BOUNDS',
                   'CLOUD_TPU_TASK_ID')


def _has_tpu_pci_device(pci_root: str) -> bool:
  for vendor_file in glob.glob(os.path.join(pci_root, '*', 'vendor')):
    try:
      with open(vendor_file, encoding='ascii') as f:
        if f.read().strip() == GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


def _matches(patterns, dev_root: str) -> bool:
  return any(glob.glob(os.path.join(dev_root, p.lstrip('/'))) for p in patterns)


def tpu_present(dev_root: str = '/', pci_root: str = '/sys/bus/pci/devices') -> bool:
  """True when the host shows a TPU device (a Cloud TPU VM): /dev/accel*, /dev/vfio/N or a PCI
  device of Google's vendor id (`dev_root` prefixes the /dev paths)."""
  return _matches(TPU_DEVICE_PATTERNS, dev_root) or _has_tpu_pci_device(pci_root)


def accelerator_present(dev_root: str = '/', pci_root: str = '/sys/bus/pci/devices') -> bool:
  """True when the host shows a TPU or GPU device."""
  return _matches(ACCELERATOR_DEVICE_PATTERNS, dev_root) or _has_tpu_pci_device(pci_root)


def _jax_backends_created() -> bool:
  bridge = sys.modules.get('jax._src.xla_bridge')
  return bool(getattr(bridge, '_backends', None))


def use_cpu_without_accelerator(environ=None, **probe_roots) -> bool:
  """Sets JAX_PLATFORMS=cpu in `environ` (default os.environ) when it is unset and no
  accelerator is present; returns whether it did. Call before JAX creates its backends."""
  environ = os.environ if environ is None else environ
  if (environ.get(PLATFORMS_VARIABLE) or any(environ.get(v) for v in TPU_ENVIRONMENT)
      or accelerator_present(**probe_roots)):
    return False
  if environ is os.environ and _jax_backends_created():
    return False  # too late to choose: JAX already picked its platforms
  environ[PLATFORMS_VARIABLE] = 'cpu'
  if environ is os.environ and 'jax' in sys.modules:
    sys.modules['jax'].config.update('jax_platforms', 'cpu')
  return True
