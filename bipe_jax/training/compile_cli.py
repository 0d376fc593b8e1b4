"""What `train/compile.py` runs: compile, print the per-chip table, turn errors into one line.

With `predict`, it also prints the planning figures of XLA's TPU cost model (step time,
tokens/s and MFU per chip, hours for the token budget: training/step_cost.py).

Exit codes: 0 the training (and evaluation) steps fit every chip's HBM, 1 they do not (one line
on stderr naming what would help), 2 a bad config, topology or eval length.
"""

import json
import sys

from bipe_jax.training import aot_compile
from bipe_jax.training import config_validation
from bipe_jax.training import step_cost


def run(config, topology: str, *, num_slices: int = 1, eval_lengths=(), eval_batch_size: int = 0,
        output: str = '', predict: bool = False) -> int:
  """Compiles and prints; with `predict`, also the planning figures of the cost model
  (training/step_cost.py: two more compiles) when the step fits."""
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
    report = aot_compile.compile_for_topology(config, topology, num_slices=num_slices,
                                              eval_lengths=lengths,
                                              eval_batch_size=eval_batch_size)
  except (config_validation.ConfigError, aot_compile.CompileError) as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  print(aot_compile.format_report(report), flush=True)
  record = report.to_json()
  if predict and record['fits']:
    try:
      prediction = step_cost.predict(config, topology,
                                     aot_compile.topology_devices(topology, num_slices),
                                     num_slices=num_slices)
    except (step_cost.CostingError, aot_compile.CompileError) as e:
      print(f'no prediction: {e}', flush=True)
    else:
      print('\n' + step_cost.format_prediction(prediction), flush=True)
      record['prediction'] = prediction.to_json()
  if output:
    with open(output, 'w', encoding='utf-8') as f:
      json.dump(record, f, indent=1)
  if not all(report.fits(step) for step in report.steps):
    print(f'error: {aot_compile.fit_advice(report)}', file=sys.stderr, flush=True)
    return 1
  return 0
