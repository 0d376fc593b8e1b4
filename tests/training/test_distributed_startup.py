"""bipe_jax.training.distributed: when `jax.distributed.initialize` is called, and with what.

The decision (`distributed.plan`) is a function of the flags and an environment mapping, so
every launch is checked here without a TPU or a cluster: Cloud TPU VM (JAX detects the slice),
SLURM, Open MPI, the JAX_* variables, explicit flags, and a plain single-process CPU run.
"""

import os

import pytest

from bipe_jax import platforms
from bipe_jax.training import distributed

SLURM_2 = {'SLURM_JOB_ID': '77', 'SLURM_NODELIST': 'n[1-2]', 'SLURM_NTASKS': '2',
           'SLURM_PROCID': '1', 'SLURM_LOCALID': '0'}


def _plan(environ, **kwargs):
  return distributed.plan(environ, **kwargs)


def test_a_plain_cpu_run_stays_one_process_without_initialize():
  decided = _plan({})
  assert not decided.initializes and decided.kwargs is None and decided.reason == 'single process'
  # TPU_WORKER_HOSTNAMES alone (no TPU device here) no longer decides anything
  assert not _plan({'TPU_WORKER_HOSTNAMES': 'a,b'}).initializes


def test_a_tpu_vm_always_initializes_and_lets_jax_detect_the_slice():
  for environ in ({}, {'TPU_WORKER_HOSTNAMES': 'h0'}, {'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3'}):
    decided = _plan(environ, on_tpu_vm=True)
    assert decided.initializes and decided.kwargs == {} and decided.reason == 'Cloud TPU VM'


def test_slurm_with_several_tasks_initializes_with_one_it_does_not():
  assert _plan(SLURM_2) == distributed.Plan('SLURM', {})
  assert not _plan({**SLURM_2, 'SLURM_NTASKS': '1'}).initializes
  # JAX's SLURM detection needs all five variables: with one missing, JAX could not detect it
  partial = {k: v for k, v in SLURM_2.items() if k != 'SLURM_LOCALID'}
  assert not _plan(partial).initializes


def test_open_mpi_initializes():
  assert _plan({'OMPI_MCA_orte_hnp_uri': '1531576320.0;tcp://10.0.0.1:34911'}) == (
      distributed.Plan('Open MPI', {}))


def test_jax_variables_give_the_coordinator_by_environment():
  full = {'JAX_COORDINATOR_ADDRESS': '10.0.0.1:1234', 'JAX_NUM_PROCESSES': '4',
          'JAX_PROCESS_ID': '3'}
  assert _plan(full).kwargs == dict(coordinator_address='10.0.0.1:1234', num_processes=4,
                                    process_id=3)
  # the address alone: JAX finds the count and index (e.g. on a TPU VM or SLURM)
  assert _plan({'JAX_COORDINATOR_ADDRESS': '10.0.0.1:1234'}).kwargs == {}
  with pytest.raises(ValueError, match='JAX_PROCESS_ID < JAX_NUM_PROCESSES'):
    _plan({**full, 'JAX_PROCESS_ID': '4'})
  with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='four' is not an integer"):
    _plan({**full, 'JAX_NUM_PROCESSES': 'four'})


def test_flags_win_over_everything_and_are_checked():
  flags = dict(coordinator_address='127.0.0.1:99', num_processes=2, process_id=1)
  for environ in ({}, SLURM_2, {'JAX_COORDINATOR_ADDRESS': 'x:1'}):
    decided = _plan(environ, on_tpu_vm=True, **flags)
    assert decided.reason == '--coordinator_address' and decided.kwargs == flags
  with pytest.raises(ValueError, match='--num_processes >= 1 and 0 <= --process_id'):
    _plan({}, coordinator_address='127.0.0.1:99', num_processes=2, process_id=2)
  with pytest.raises(ValueError, match='need --coordinator_address'):
    _plan({}, num_processes=2, process_id=0)


def test_the_switch_turns_detection_off_but_not_explicit_flags():
  off = {distributed.SWITCH_VARIABLE: 'off'}
  assert not _plan({**off, **SLURM_2}, on_tpu_vm=True).initializes
  assert _plan(off, coordinator_address='h:1', num_processes=1, process_id=0).initializes
  with pytest.raises(ValueError, match='BIPE_JAX_DISTRIBUTED'):
    _plan({distributed.SWITCH_VARIABLE: 'maybe'})


@pytest.mark.parametrize('device,is_tpu', [('accel0', True), ('vfio/0', True),
                                           ('nvidia0', False), (None, False)])
def test_a_tpu_vm_is_recognised_by_its_devices(tmp_path, monkeypatch, device, is_tpu):
  dev_root, pci_root = tmp_path / 'root', tmp_path / 'pci'
  (dev_root / 'dev').mkdir(parents=True)
  pci_root.mkdir()
  if device:
    path = dev_root / 'dev' / device
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('')
  assert platforms.tpu_present(str(dev_root), str(pci_root)) is is_tpu
  monkeypatch.setattr(platforms, 'tpu_present', lambda: is_tpu)
  assert distributed.tpu_vm({}) is is_tpu
  assert distributed.tpu_vm({'JAX_PLATFORMS': 'tpu,cpu'}) is is_tpu
  assert distributed.tpu_vm({'JAX_PLATFORMS': 'cpu'}) is False  # a CPU run on a TPU VM


def test_initialize_without_a_cluster_returns_false_and_prints_nothing(capsys):
  assert distributed.initialize(environ={}) is False
  assert capsys.readouterr().out == ''


def test_the_start_up_line_names_the_process_and_its_devices():
  line = distributed.describe('SLURM')
  assert line.startswith('process 0 of 1 on ') and '(SLURM): 1 local cpu devices of 1' in line, (
      line)
  assert os.uname().nodename in line
