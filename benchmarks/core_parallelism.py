"""Do this host's cores compute in parallel? One single-threaded matmul loop alone vs one per core.

Run:  .venv/bin/python benchmarks/core_parallelism.py [--size 1024] [--seconds 4]
      [--out benchmarks/results/core_parallelism]

Each worker is a fresh interpreter pinned to one core (os.sched_setaffinity) running a jitted
float32 [size, size] @ [size, size] product on one XLA thread (NPROC=1, bipe_jax.training.
cpu_devices) for `--seconds`.
First one worker runs alone, then one per usable core at the same time. The table gives each
worker's GFLOP/s and the parallel efficiency: (sum of the concurrent rates) / (cores x the rate
alone). 1.0 = the cores are independent; 1 / cores = they share one core's worth of compute
(e.g. SMT siblings on the VM's host, or a CPU quota), in which case data-parallel CPU devices
(`--cpu_devices 2`) cannot be faster than one. Measured in this host's slow state of
2026-11-23 (benchmarks/README.md): 0.96-1.00, so core sharing was not what slowed it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top

WORKER = r'''
import json, os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
import jax, jax.numpy as jnp
n, seconds = int(sys.argv[2]), float(sys.argv[3])
a = jnp.ones((n, n), jnp.float32)
f = jax.jit(lambda x: x @ x)
f(a).block_until_ready()
print('ready', flush=True)
start_at = float(sys.stdin.readline())  # the same moment for every worker
while time.time() < start_at:
  time.sleep(0.001)
count, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
  f(a).block_until_ready()
  count += 1
print(json.dumps({'flops_per_s': 2.0 * n ** 3 * count / (time.perf_counter() - t0)}))
'''


def run_workers(cores: list[int], size: int, seconds: float) -> list[float]:
  """FLOP/s of one worker per entry of `cores`, all timed from the same moment: each worker
  imports JAX and compiles, says 'ready', and is then told when to start."""
  from bipe_jax.kernels import cpu_devices  # pylint: disable=g-import-not-at-top
  env = cpu_devices.single_thread_environment(
      {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', 'NPROC')})
  procs = [subprocess.Popen([sys.executable, '-c', WORKER, str(c), str(size), str(seconds)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env) for c in cores]
  for p in procs:
    if p.stdout.readline().strip() != 'ready':
      _, err = p.communicate(timeout=120)
      raise RuntimeError(f'worker failed (exit {p.returncode}): {err.strip()[-500:]}')
  start_at = time.time() + 0.2
  for p in procs:
    p.stdin.write(f'{start_at}\n')
    p.stdin.flush()
  rates = []
  for p in procs:
    out, err = p.communicate(timeout=120 + seconds)
    if p.returncode != 0:
      raise RuntimeError(f'worker failed (exit {p.returncode}): {err.strip()[-500:]}')
    rates.append(json.loads(out.strip().splitlines()[-1])['flops_per_s'])
  return rates


def parallel_efficiency(alone: float, concurrent: list[float]) -> float:
  """sum(concurrent) / (len(concurrent) * alone): 1.0 = independent cores."""
  if alone <= 0 or not concurrent:
    raise ValueError(f'need a positive rate alone and >= 1 concurrent rate, got {alone}, '
                     f'{concurrent}')
  return sum(concurrent) / (len(concurrent) * alone)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--size', type=int, default=1024)
  p.add_argument('--seconds', type=float, default=4.0)
  p.add_argument('--out', default=None, help='path prefix for .md/.json results')
  args = p.parse_args(argv)
  cores = sorted(os.sched_getaffinity(0))
  alone = run_workers(cores[:1], args.size, args.seconds)[0]
  together = run_workers(cores, args.size, args.seconds)
  eff = parallel_efficiency(alone, together)
  rows = [['1 worker alone (core %d)' % cores[0], f'{alone / 1e9:.0f}', f'{alone / 1e9:.0f}']]
  rows.append([f'{len(cores)} workers at once (cores {",".join(map(str, cores))})',
               ' / '.join(f'{r / 1e9:.0f}' for r in together), f'{sum(together) / 1e9:.0f}'])
  table = common.markdown_table(['run', 'GFLOP/s per worker', 'GFLOP/s in all'], rows)
  common.report(f'Core parallelism ({args.size}^3 float32 matmul, single-threaded workers)',
                table, [f'parallel efficiency: {eff:.2f} (1.0 = independent cores, '
                        f'{1 / len(cores):.2f} = one core shared)'],
                out=args.out, data={'alone': alone, 'together': together,
                                    'parallel_efficiency': eff, 'cores': cores,
                                    'size': args.size, 'seconds': args.seconds})


if __name__ == '__main__':
  main()
