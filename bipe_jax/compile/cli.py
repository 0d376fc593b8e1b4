"""What `train/compile.py` runs: compile, print the per-chip table, turn errors into one line.

Exit codes: 0 the training (and evaluation) steps fit every chip's HBM, 1 they do not (one line
on stderr naming what would help), 2 a bad config, topology or eval length, 3 (--platform=cuda
without the CUDA plugin) lowered for CUDA but not compiled: the lowered program's summary is
printed and one line says why it could not be compiled.

With `predict` (TPU), it also prints the planning figures of XLA's TPU cost model (step time,
tokens/s and MFU per chip, hours for the token budget: compile/step_cost.py).
"""

import sys

from bipe_jax.compile import aot
from bipe_jax.compile import gpu_lowering
from bipe_jax.compile import gpu_targets
from bipe_jax.compile import report as report_lib
from bipe_jax.compile import step_cost
from bipe_jax.compile import topologies
from bipe_jax import storage
from bipe_jax.compile.topologies import CompileError
from bipe_jax import run_config

LOWERED_ONLY = 3
DEFAULT_TPU_TOPOLOGY = 'v5e:2x4'  # --topology when none is given on --platform=tpu
GPU_TOPOLOGY_EXAMPLES = 'h100:8, h200:2x8, a100:8, or local (this host\'s own GPUs)'


def resolve_topology(topology: str, platform: str) -> str:
  """The topology to compile for: `topology` as given, else (TPU) DEFAULT_TPU_TOPOLOGY. A GPU
  platform has no default: a TPU slice's name means nothing there, so a CompileError asks for
  --topology (one line)."""
  if topology:
    return topology
  if platform == 'tpu':
    return DEFAULT_TPU_TOPOLOGY
  raise CompileError(f'--platform={platform} needs --topology=GPU:COUNT or GPU:HOSTSxCOUNT '
                     f'(e.g. {GPU_TOPOLOGY_EXAMPLES})')


def run(config, topology: str, *, num_slices: int = 1, eval_lengths=(), eval_batch_size: int = 0,
        output: str = '', platform: str = 'tpu', predict: bool = False) -> int:
  """Compiles and prints; with `predict` on a TPU topology, also the planning figures of the
  cost model (compile/step_cost.py: two more compiles) when the step fits."""
  try:
    lengths = [int(x) for x in eval_lengths]
  except ValueError:
    print(f'error: --eval_lengths={",".join(eval_lengths)} must be integers', file=sys.stderr)
    return 2
  if num_slices < 1 or any(n < 2 for n in lengths):
    print(f'error: --num_slices={num_slices} must be >= 1 and --eval_lengths >= 2',
          file=sys.stderr)
    return 2
  try:
    topology = resolve_topology(topology, platform)
  except CompileError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  lower_only = gpu_targets.lower_only_reason() if platform == 'cuda' else None
  try:
    if lower_only:
      report = aot.lower_for_cuda(config, topology, eval_lengths=lengths,
                                  eval_batch_size=eval_batch_size)
    else:
      devices = topologies.platform_devices(platform, topology, num_slices)
      what = 'the training step' + (f' and the evaluation forward at {",".join(map(str, lengths))}'
                                    if lengths else '')
      then = ('; then the prediction compiles two costing programs, 2-8 minutes more'
              if predict and platform == 'tpu' else '')
      print(f'compiling {what} for {topology} ({len(devices)} devices): about a minute for the '
            f'151M preset on a 2-core host{then}', flush=True)
      report = aot.compile_for_topology(config, topology, num_slices=num_slices,
                                        eval_lengths=lengths, eval_batch_size=eval_batch_size,
                                        devices=devices, platform=platform)
  except (run_config.ConfigError, CompileError) as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  if lower_only:
    print(f'{topology}: one device\'s share of the step (batch {report.config_summary["batch_size"]}'
          f' per device), lowered for CUDA on this host', flush=True)
    for step in report.steps:
      print(gpu_lowering.format_summary(step.name, step.lowered_summary), flush=True)
    if output:
      storage.write_json(output, report.to_json(), indent=1)
    print(f'not compiled: {lower_only}', file=sys.stderr, flush=True)
    return LOWERED_ONLY
  print(report_lib.format_report(report), flush=True)
  record = report.to_json()
  if predict and record['fits'] and platform == 'tpu':
    try:
      prediction = step_cost.predict(config, topology, devices, num_slices=num_slices,
                                     progress=lambda line: print(line, flush=True))
    except (step_cost.CostingError, CompileError) as e:
      print(f'no prediction: {e}', flush=True)
    else:
      print('\n' + step_cost.format_prediction(prediction), flush=True)
      record['prediction'] = prediction.to_json()
  elif predict and platform != 'tpu':
    print('no prediction: the step-time model reads XLA\'s TPU cost model, which GPU programs '
          'lack', flush=True)
  if output:
    storage.write_json(output, record, indent=1)
  if not all(report.fits(step) for step in report.steps):
    print(f'error: {report_lib.fit_advice(report)}', file=sys.stderr, flush=True)
    return 1
  return 0
