"""What `train/compile.py` runs: compile, print the per-chip table, turn errors into one line.

Exit codes: 0 the training (and evaluation) steps fit every chip's HBM, 1 they do not (one line
on stderr naming what would help), 2 a bad config, topology or eval length.
"""

import sys

from bipe_jax import workdir_io
from bipe_jax.training import aot_compile
from bipe_jax.training import config_validation


def run(config, topology: str, *, num_slices: int = 1, eval_lengths=(), eval_batch_size: int = 0,
        output: str = '') -> int:
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
  if output:
    workdir_io.write_json(output, report.to_json(), indent=1)
  if not all(report.fits(step) for step in report.steps):
    print(f'error: {aot_compile.fit_advice(report)}', file=sys.stderr, flush=True)
    return 1
  return 0
