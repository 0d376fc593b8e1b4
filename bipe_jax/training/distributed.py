"""Multi-host start-up: when to call `jax.distributed.initialize`, and with what.

Must run before anything touches a JAX device. The decision (`plan`) reads only its arguments,
so every combination is testable without a cluster:
- explicit flags `--coordinator_address/--num_processes/--process_id` win;
- else the environment form of the same (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
  JAX_PROCESS_ID), e.g. a GPU cluster started by hand or by a launcher that exports them;
- else a cluster JAX detects itself: a Cloud TPU VM (a TPU device on the host, JAX_PLATFORMS not
  excluding it; JAX asks the TPU metadata server or reads TPU_WORKER_HOSTNAMES / MEGASCALE_* on
  GKE for the slice's workers, so one host of a v5e-32 and a single v5e-8 both initialise),
  a multi-task SLURM job, an Open MPI launch (mpirun);
- else one process, without initialize (a CPU run, or one GPU / TPU host started by hand with
  BIPE_JAX_DISTRIBUTED=off).
CPU collectives across processes use gloo (set explicitly for clarity).
"""

from __future__ import annotations

import dataclasses
import os
import socket

import jax

from bipe_jax import platforms

# off: never initialise (one process); auto (default): as above.
SWITCH_VARIABLE = 'BIPE_JAX_DISTRIBUTED'
SLURM_VARIABLES = ('SLURM_JOB_ID', 'SLURM_NODELIST', 'SLURM_NTASKS', 'SLURM_PROCID',
                   'SLURM_LOCALID')  # what JAX's SLURM detection reads
OPEN_MPI_VARIABLE = 'OMPI_MCA_orte_hnp_uri'
ENVIRONMENT_NAMES = ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID')


@dataclasses.dataclass(frozen=True)
class Plan:
  """How this process starts. `reason` names what decided it (for the start-up line).

  kwargs: the arguments of `jax.distributed.initialize` ({} = let JAX detect everything);
    None when the run stays a single process without initialize.
  """
  reason: str
  kwargs: dict | None

  @property
  def initializes(self) -> bool:
    return self.kwargs is not None


def _int(environ, name: str, default: int) -> int:
  value = environ.get(name, '')
  try:
    return int(value) if value != '' else default
  except ValueError:
    raise ValueError(f'environment variable {name}={value!r} is not an integer') from None


def _explicit(address: str, num_processes: int, process_id: int, names: tuple) -> dict:
  """initialize's arguments; `names` = how the user gave (address, count, index)."""
  if num_processes < 1 or not 0 <= process_id < num_processes:
    raise ValueError(
        f'{names[0]}={address} needs {names[1]} >= 1 and 0 <= {names[2]} < {names[1]}; got '
        f'{names[1]}={num_processes}, {names[2]}={process_id}')
  return dict(coordinator_address=address, num_processes=num_processes, process_id=process_id)


def tpu_vm(environ=None) -> bool:
  """True on a host with a TPU device that JAX may use (JAX_PLATFORMS unset or naming tpu)."""
  environ = os.environ if environ is None else environ
  chosen = environ.get(platforms.PLATFORMS_VARIABLE, '')
  if chosen and 'tpu' not in chosen.split(','):
    return False
  return platforms.tpu_present()


def plan(environ, *, coordinator_address: str = '', num_processes: int = 0,
         process_id: int = -1, on_tpu_vm: bool = False) -> Plan:
  """The start-up decision for the flags and the environment `environ` (a mapping).

  Raises:
    ValueError: flags or variables that are incomplete or inconsistent.
  """
  if coordinator_address:
    return Plan('--coordinator_address', _explicit(
        coordinator_address, num_processes, process_id,
        ('--coordinator_address', '--num_processes', '--process_id')))
  if num_processes > 1 or process_id >= 0:
    raise ValueError('--num_processes / --process_id need --coordinator_address=host:port')
  switch = environ.get(SWITCH_VARIABLE, 'auto').lower()
  if switch not in ('auto', 'off'):
    raise ValueError(f'{SWITCH_VARIABLE}={switch!r} is not one of auto, off')
  if switch == 'off':
    return Plan(f'{SWITCH_VARIABLE}=off', None)
  if environ.get('JAX_COORDINATOR_ADDRESS'):
    if 'JAX_NUM_PROCESSES' in environ or 'JAX_PROCESS_ID' in environ:
      return Plan('JAX_COORDINATOR_ADDRESS', _explicit(
          environ['JAX_COORDINATOR_ADDRESS'], _int(environ, 'JAX_NUM_PROCESSES', 0),
          _int(environ, 'JAX_PROCESS_ID', -1), ENVIRONMENT_NAMES))
    return Plan('JAX_COORDINATOR_ADDRESS', {})  # JAX detects the count and index
  if on_tpu_vm:
    return Plan('Cloud TPU VM', {})
  if all(v in environ for v in SLURM_VARIABLES) and _int(environ, 'SLURM_NTASKS', 1) > 1:
    return Plan('SLURM', {})
  if OPEN_MPI_VARIABLE in environ:
    return Plan('Open MPI', {})
  return Plan('single process', None)


def initialize(coordinator_address: str = '', num_processes: int = 0,
               process_id: int = -1, environ=None) -> bool:
  """Starts the JAX distributed runtime when `plan` says so; prints one line naming this
  process. Returns True when the runtime was initialised.

  Raises:
    ValueError: when the flags or variables are incomplete or inconsistent.
  """
  environ = os.environ if environ is None else environ
  decided = plan(environ, coordinator_address=coordinator_address,
                 num_processes=num_processes, process_id=process_id,
                 on_tpu_vm=tpu_vm(environ))
  if not decided.initializes:
    return False
  if str(jax.config.jax_platforms or '').split(',')[0] in ('', 'cpu'):
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(**decided.kwargs)
  print(describe(decided.reason), flush=True)
  return True


def describe(reason: str) -> str:
  """One line: which process this is, on which host, with which devices."""
  local = jax.local_devices()
  kind = local[0].device_kind if local else 'none'
  return (f'process {jax.process_index()} of {jax.process_count()} on {socket.gethostname()} '
          f'({reason}): {len(local)} local {kind} devices of {jax.device_count()}')

