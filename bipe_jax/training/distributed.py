"""Multi-host start-up: `jax.distributed.initialize` from flags, or automatically on TPU / SLURM.

Must run before anything touches a JAX device. CPU collectives across processes use gloo
(jax 0.10's default `jax_cpu_collectives_implementation`; set explicitly for clarity).
"""

import os

import jax
from absl import logging


def _cluster_detected() -> bool:
  """True on a multi-task SLURM job or a multi-host Cloud TPU slice (JAX detects both)."""
  if int(os.environ.get('SLURM_NTASKS', '1') or 1) > 1 and 'SLURM_JOB_ID' in os.environ:
    return True
  hosts = os.environ.get('TPU_WORKER_HOSTNAMES', '')
  return len([h for h in hosts.split(',') if h]) > 1 or 'MEGASCALE_COORDINATOR_ADDRESS' in os.environ


def initialize(coordinator_address: str = '', num_processes: int = 0,
               process_id: int = -1) -> bool:
  """Starts the JAX distributed runtime when asked (flags) or when a cluster is detected.

  Args:
    coordinator_address: 'host:port' of process 0; '' = none given.
    num_processes: total process count (with coordinator_address).
    process_id: this process's index in [0, num_processes).
  Returns:
    True when the distributed runtime was initialised.
  Raises:
    ValueError: when the flags are incomplete or inconsistent.
  """
  if coordinator_address:
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(
          f'--coordinator_address={coordinator_address} needs --num_processes >= 1 and '
          f'0 <= --process_id < num_processes; got num_processes={num_processes}, '
          f'process_id={process_id}')
    if jax.config.jax_platforms in (None, '', 'cpu') or 'cpu' in str(jax.config.jax_platforms):
      jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  elif num_processes > 1 or process_id >= 0:
    raise ValueError('--num_processes / --process_id need --coordinator_address=host:port')
  elif _cluster_detected():
    jax.distributed.initialize()  # SLURM / TPU: JAX reads the cluster from the environment
  else:
    return False
  logging.info('jax.distributed: process %d of %d, %d local / %d global devices',
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True
