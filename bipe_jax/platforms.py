"""Choose JAX's CPU platform for a run on a host without an accelerator, before JAX starts.

With the `libtpu` wheel installed (requirements-tpu.txt, for compiling TPU programs on any
host), JAX's default platform search tries the TPU backend first; on a host with no TPU that
prints several lines of libtpu initialisation errors and only then falls back to the CPU. The
entry points call `use_cpu_without_accelerator()` first thing: when JAX_PLATFORMS is unset and
the host has no TPU or GPU device, it sets JAX_PLATFORMS=cpu, so a CPU run starts quietly. On a
TPU VM (/dev/accel* or /dev/vfio devices, or Google's TPU PCI vendor id) or a GPU host
(/dev/nvidia*, ROCm's /dev/kfd) nothing is set and JAX picks the accelerator as usual; a
JAX_PLATFORMS the user set always wins. JAX reads the variable when it is imported, so when it
already is (importing the bipe_jax package imports it) its `jax_platforms` setting is updated
too; either way this must run before JAX creates its backends (the first array or device query).
"""

import glob
import os
import sys

PLATFORMS_VARIABLE = 'JAX_PLATFORMS'
GOOGLE_PCI_VENDOR = '0x1ae0'  # TPU chips on the PCI bus of a TPU VM
TPU_DEVICE_PATTERNS = ('/dev/accel*', '/dev/vfio/[0-9]*')
ACCELERATOR_DEVICE_PATTERNS = TPU_DEVICE_PATTERNS + ('/dev/nvidia[0-9]*', '/dev/nvidiactl',
                                                     '/dev/kfd', '/dev/dxg')


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


def use_cpu_without_accelerator(environ=None, **probe_roots) -> bool:
  """Sets JAX_PLATFORMS=cpu in `environ` (default os.environ) when it is unset and no
  accelerator is present; returns whether it did. Call before JAX creates its backends."""
  environ = os.environ if environ is None else environ
  if environ.get(PLATFORMS_VARIABLE) or accelerator_present(**probe_roots):
    return False
  environ[PLATFORMS_VARIABLE] = 'cpu'
  if environ is os.environ and 'jax' in sys.modules:
    sys.modules['jax'].config.update('jax_platforms', 'cpu')
  return True
