"""Every script in benchmarks/ runs at its smallest size, so a documented command cannot break
silently (benchmarks/README.md's commands are these scripts with larger sizes). The TPU group
is in test_benchmarks_smoke_tpu.py (another file: pytest-xdist's --dist loadfile gives it to
the other worker).

The scripts of one group run one after another in ONE Python process (a driver that executes
each file as `__main__` with its command-line arguments, as `python benchmarks/X.py ...` would):
JAX, PyTorch and libtpu start once per group, and a compile one script shares with another is
read from the suite's compilation cache. A script fails its smoke run when it exits non-zero,
raises, or reports a point as `"error"` (several benchmarks turn an exception into an error row
so that one out-of-memory point does not stop a sweep: at these sizes nothing may fail).
"""

import json
import os
import subprocess
import sys

import pytest
from tests import fixtures

ROOT = fixtures.ROOT
BENCHMARKS = os.path.join(ROOT, 'benchmarks')
LIBRARIES = {'__init__.py', 'common.py', 'jax_step.py'}  # imported by the scripts, not run
ONE_STEP = ['--cpu_devices', '1', '--warmup', '0', '--repeats', '1']
TINY_SHAPE = ['--layers', '1', '--width', '32', '--heads', '2', '--ffn', '64', '--vocab', '64',
              '--batch', '2', '--seq', '16']

# script -> (group, arguments); {tmp} is the test's temporary directory.
SMOKE = {
    # The project's training step (benchmarks/jax_step.py) and the PyTorch side.
    'encoding_cost.py': ('steps', ['--preset', 'smoke', '--encodings', 'bipe_rope', *ONE_STEP]),
    'mfu.py': ('steps', ['--presets', 'smoke', '--encodings', 'rope', *ONE_STEP]),
    'profile_step.py': ('steps', ['--preset', 'smoke', '--steps', '1', '--top', '3']),
    'scan_layers.py': ('steps', ['--depths', '1', '--preset', 'smoke', *ONE_STEP]),
    'vs_pytorch.py': ('steps', [*TINY_SHAPE, '--impls', 'dense', *ONE_STEP]),
    'hf_llama_step.py': ('steps', [*TINY_SHAPE, '--warmup', '0', '--repeats', '1']),
    # Kernels, memory, data, cores.
    'matmul_peak.py': ('other', ['--warmup', '0', '--repeats', '1', '--dtypes', 'float32',
                                 '--max_dim', '512']),
    'attention_layouts.py': ('other', ['--batch', '1', '--seq', '32', '--heads', '2',
                                       '--head_dim', '8', '--block_size', '16', '--warmup', '0',
                                       '--repeats', '1']),
    'flash_in_scan_memory.py': ('other', ['--lengths', '64,128', '--block', '32']),
    'long_context.py': ('other', ['--lengths', '64', '--encodings', 'bipe_rope', '--impls',
                                  'blockwise', '--block_size', '32', '--repeats', '1']),
    'long_context_training_memory.py': ('other', ['--target', 'cpu', '--lengths', '64',
                                                  '--encodings', 'rope', '--layers', '1',
                                                  '--block_size', '32']),
    'core_parallelism.py': ('other', ['--size', '32', '--seconds', '0.2']),
    'row_mixing.py': ('other', ['--data_dir', '{tmp}/data', '--seq_lens', '64', '--windows',
                                '0', '--batches', '2', '--owner_rows', '64']),
    'data_pipeline.py': ('other', ['--data_dir', '{tmp}/data', '--nofresh', '--batches', '2',
                                   '--batch_size', '2', '--seq_lens', '128', '--threads', '0,1',
                                   '--notokenize_rate']),
    'fox_pruning.py': ('other', ['--lengths', '64', '--heads', '2', '--head_dim', '8',
                                 '--block_size', '32', '--gates', 'local', '--repeats', '1']),
    # The GPU step benchmark at its smallest size (any platform; the Triton kernel's own tests
    # run it in Pallas interpret mode: tests/attention/test_pallas_gpu_attention.py).
    'gpu_step.py': ('steps', ['--smoke', '--encodings', 'bipe_alibi', '--impls', 'blockwise']),
    # Last in its process: it makes the process single-threaded.
    'head_and_weight_gradient.py': ('other', ['--tokens', '64', '--repeats', '1']),
    # Compiled for TPU by libtpu on this host.
    'pallas_tpu_memory.py': ('tpu', ['--preset', 'tiny', '--lengths', '128', '--impls',
                                     'pallas', '--topology', 'v5e:2x2', '--remat', 'full']),
    'context_parallel_compile.py': ('tpu', ['--preset', 'tiny', '--seq_len', '128',
                                            '--topology', 'v5e:2x2', '--context', '4',
                                            '--block_size', '32', '--dtype', 'float32',
                                            '--out', '{tmp}/context_parallel.jsonl']),
    # Its rows are the big presets; the table is rendered from a tiny row compiled the same
    # way (compile_row: train/compile.py with --output), see _DRIVER: one layer, vocabulary 512,
    # batch 8 (4.8 CPU-seconds, against 13.8 at the tiny preset's 4,096 and 32).
    'compile_table.py': ('tpu', ['--table_only', '--dir', '{tmp}/compile_table']),
    # Two encodings and the stock splash anchor, one layer each (the step-difference check,
    # --check_step, compiles two whole steps more: left to the benchmark's own runs).
    'tpu_layer_cost.py': ('tpu', ['--encodings', 'bipe_rope,bipe_alibi', '--impls', 'pallas',
                                  '--batch_per_chip', '1', '--seq', '256', '--width', '128',
                                  '--heads', '2', '--ffn', '256', '--vocab', '512',
                                  '--block_size', '128', '--splash_block', '128',
                                  '--topology', 'v5e:2x2',
                                  '--out', '{tmp}/tpu_layer_cost']),
}

_DRIVER = r'''
import json, os, runpy, sys, time, traceback
runs, tmp = json.loads(sys.argv[1]), sys.argv[2]
for script, argv in runs:
  path = os.path.join('benchmarks', script)
  if script == 'compile_table.py':  # one row at the smallest size, then the table from it
    from benchmarks import compile_table
    os.makedirs(os.path.join(tmp, 'compile_table'))
    compile_table.compile_row('rope_1k', '--config=configs/tiny.py --topology=v5e:2x2 '
                              '--config.model.num_layers=1 --config.model.vocab_size=512 '
                              '--config.train.batch_size=8', os.path.join(tmp, 'compile_table'))
  sys.argv = [path, *argv]
  print(f'smoke start: {script}', flush=True)
  start = time.time()
  try:
    runpy.run_path(path, run_name='__main__')
  except SystemExit as e:
    if e.code not in (0, None):
      print(f'smoke FAILED: {script} exited {e.code}', flush=True)
      sys.exit(1)
  except BaseException:
    traceback.print_exc()
    print(f'smoke FAILED: {script} raised', flush=True)
    sys.exit(1)
  print(f'smoke ok: {script}', flush=True)
  print(f'smoke seconds: {script} {time.time() - start:.1f}', flush=True)
'''


def test_every_benchmark_script_has_a_smoke_run():
  scripts = {n for n in os.listdir(BENCHMARKS) if n.endswith('.py')} - LIBRARIES
  assert {g for g, _ in SMOKE.values()} == {'steps', 'other', 'tpu'}  # each group has a test
  assert scripts == set(SMOKE), ('add a smallest-size run to SMOKE for '
                                 f'{sorted(scripts - set(SMOKE))}; '
                                 f'no such script: {sorted(set(SMOKE) - scripts)}')


def run_group(group, tmp_path):
  """Runs the scripts of `group` in one driver process; asserts each ran cleanly."""
  runs = [(script, [a.replace('{tmp}', str(tmp_path)) for a in argv])
          for script, (g, argv) in SMOKE.items() if g == group]
  env = dict(os.environ, PYTHONPATH=ROOT, ALLOW_MULTIPLE_LIBTPU_LOAD='1')
  proc = subprocess.run([sys.executable, '-c', _DRIVER, json.dumps(runs), str(tmp_path)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
  out = proc.stdout + proc.stderr
  print('\n'.join(l for l in proc.stdout.splitlines() if l.startswith('smoke seconds: ')))
  assert proc.returncode == 0, out[-6000:]
  assert [l for l in proc.stdout.splitlines() if l.startswith('smoke ok: ')] == [
      f'smoke ok: {s}' for s, _ in runs], out[-6000:]
  assert '"error"' not in out, out[-6000:]


@pytest.mark.slow
@pytest.mark.parametrize('group', ['steps', 'other'])  # 'tpu': test_benchmarks_smoke_tpu.py
def test_benchmark_scripts_run_at_their_smallest_size(group, tmp_path):
  run_group(group, tmp_path)
