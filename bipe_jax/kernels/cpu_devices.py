"""Split a CPU host into several single-threaded JAX devices, for data-parallel training.

On a small CPU host, XLA's intra-op threading uses the cores poorly for the small matmuls of a
narrow model: measured on the project's 2-core machine (tiny preset, batch 32 x 64 tokens), one
device using both cores trains at ~9.5k tokens/s, while two single-threaded CPU devices with the
batch split between them (the ordinary data-parallel mesh, gradients averaged across the two)
train at ~12.7k tokens/s, 1.33x faster, with the same losses. `use_cpu_devices(n)` sets that up.

Single-threaded takes two settings in this jaxlib: `--xla_cpu_multi_thread_eigen=false` in
XLA_FLAGS, and `NPROC=1`, which sizes the CPU client's intra-op thread pool. With the flag alone
a device's matmuls still ran on a pool of every core (measured: one 1024^2 float32 matmul loop
kept two threads busy, 1.86 CPU-seconds per second); with both, one thread per device.

It must run before JAX creates its CPU backend (before the first `jax.devices()` or array), and
it only concerns the CPU platform: on GPU / TPU hosts the settings are inert. Because the devices
form the mesh's data axis, the global batch must be divisible by their number.
"""

import os

# One compute thread per CPU device: the devices themselves run in parallel.
SINGLE_THREAD_XLA_FLAGS = ('--xla_cpu_multi_thread_eigen=false',)
THREAD_POOL_SIZE_VARIABLE = 'NPROC'  # read by XLA's CPU client for its intra-op pool size


class CpuDevicesError(ValueError):
  """The CPU device count cannot be applied (bad value, or JAX already started its backend)."""


def _user_set_threads(environ) -> bool:
  flags = environ.get('XLA_FLAGS', '')
  return THREAD_POOL_SIZE_VARIABLE in environ or 'xla_cpu_multi_thread_eigen' in flags


def single_thread_environment(environ) -> dict:
  """A copy of `environ` with XLA on one thread per device (the flag and NPROC=1), unless the
  user already chose XLA's threading there (NPROC, or a thread flag in XLA_FLAGS): theirs wins."""
  env = dict(environ)
  if _user_set_threads(env):
    return env
  env['XLA_FLAGS'] = ' '.join([env.get('XLA_FLAGS', '').strip(),
                               *SINGLE_THREAD_XLA_FLAGS]).strip()
  env[THREAD_POOL_SIZE_VARIABLE] = '1'
  return env


def use_cpu_devices(count: int, environ=None) -> int:
  """Makes JAX's CPU platform `count` single-threaded devices (1 = leave JAX's default).

  Returns `count`. Raises CpuDevicesError for a count < 1 or when the backend already exists.
  """
  if isinstance(count, bool) or not isinstance(count, int) or count < 1:
    raise CpuDevicesError(f'--cpu_devices={count!r} is invalid: must be an integer >= 1')
  if count == 1:
    return 1
  environ = os.environ if environ is None else environ
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  if xla_bridge.backends_are_initialized():
    raise CpuDevicesError(f'--cpu_devices={count}: JAX already created its devices; set it '
                          'before anything touches jax.devices() or creates an array')
  environ.update(single_thread_environment(environ))
  jax.config.update('jax_num_cpu_devices', count)
  return count
