"""Compiles every preset row of docs/accelerators.md for its TPU slice and prints the table.

    JAX_PLATFORMS=cpu nice -n 5 python -m benchmarks.compile_table --out compile_table.json

Each row is one `train/compile.py` command (ROWS below: the arguments after the script name),
run as a subprocess one after another with `--output=` a JSON file; the table is built from those
files only, so every figure in it is the compiled program's. A row whose step does not fit is
kept (the compile exits 1 and still writes its figures). `--only NAME` compiles some rows;
`--table_only` rebuilds the table from the JSON files of an earlier run in `--dir`.
"""

import argparse
import os
import subprocess
import sys
import time

from bipe_jax import storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024 ** 3

_151M = '--config=configs/paper_151m.py:{} --topology=v5e:2x4'
ROWS = [
    ('rope_1k', _151M.format('rope')),
    ('alibi_1k', _151M.format('alibi')),
    ('bipe_rope_1k', _151M.format('bipe_rope')),
    ('bipe_alibi_1k', _151M.format('bipe_alibi')),
    ('bipe_rope_8k', _151M.format('bipe_rope')
     + ' --config.data.seq_len=8192 --config.train.batch_size=32'),
    ('bipe_alibi_8k', _151M.format('bipe_alibi')
     + ' --config.data.seq_len=8192 --config.train.batch_size=32'),
    ('bipe_rope_32k', _151M.format('bipe_rope')
     + ' --config.data.seq_len=32768 --config.train.batch_size=8'),
    ('bipe_alibi_32k', _151M.format('bipe_alibi')
     + ' --config.data.seq_len=32768 --config.train.batch_size=8'),
    ('llama_1b_4k', '--config=configs/llama_1b.py:bipe_rope,4096 --topology=v5e:4x4'),
    ('llama_1b_4k_save_projections', '--config=configs/llama_1b.py:bipe_rope,4096 '
     '--topology=v5e:4x4 --config.model.remat=save_projections'),
    ('llama_1b_32k', '--config=configs/llama_1b.py:bipe_rope,32768 --topology=v5e:4x4'),
]


def compile_row(name: str, args: str, directory: str) -> dict:
  """Runs train/compile.py for one row; returns its JSON figures (+ the exit code). Without
  the step-time prediction (`--nopredict`: two more compiles, which the table does not show)."""
  out = storage.join(directory, f'{name}.json')
  command = [sys.executable, 'train/compile.py', *args.split(), '--nopredict', f'--output={out}']
  env = dict(os.environ, JAX_PLATFORMS='cpu', ALLOW_MULTIPLE_LIBTPU_LOAD='1')
  proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
  figures = storage.read_json(out)
  if figures is None:
    raise RuntimeError(f'{name}: train/compile.py wrote no figures: {proc.stderr.strip()[-400:]}')
  figures['exit_code'] = proc.returncode
  storage.write_json(out, figures, indent=1)
  return figures


def _mesh(figures: dict) -> str:
  axes = [f'{k}={v}' for k, v in figures['mesh'].items() if v > 1]
  return f'{figures["topology"]} ({" x ".join(axes) or "1 chip"})'


def table_row(args: str, figures: dict) -> str:
  """One markdown row: command, slice (mesh), batch, memory per chip, fit, FLOPs, collectives,
  compile time."""
  step = figures['steps'][0]
  s = figures['config_summary']
  state = (figures['param_bytes'] + figures['optimizer_bytes']) / GIB
  c = step['collectives']
  count = lambda kind: (f'{c[kind]["ops"]}/{c[kind]["arrays"]}'  # pylint: disable=unnecessary-lambda-assignment
                        if kind in c else '0')
  if step['out_of_memory']:
    temps, flops = 'refused', '-'
    collectives = '-'
  else:
    temps = f'{step["temp_bytes"] / GIB:.2f} GiB'
    flops = f'{step["flops"] / 1e12:.2f}'
    collectives = ', '.join(f'{k} {count(k)}' for k in
                            ('all-gather', 'reduce-scatter', 'all-reduce', 'collective-permute')
                            if k in c)
  return ' | '.join([
      '', f'`{args}`', _mesh(figures), f'{s["batch_size"]} x {s["seq_len"]}',
      f'{s["dtype"]}, remat {s["remat"]}', f'{state:.2f} GiB', temps,
      f'{step["total_bytes"] / GIB:.2f} / {figures["hbm_bytes"] / GIB:.0f} GiB',
      'yes' if figures['fits'] else '**no**', f'{step["model_flops"] / 1e12:.1f}', flops,
      collectives, f'{step["compile_seconds"]:.0f} s', '']).strip()


HEADER = ('| command (`python train/compile.py ...`) | slice (mesh) | batch | compute | '
          'params + optimizer / chip | temporaries / chip | total / chip of HBM | fits | '
          'model TFLOP / chip / step | XLA TFLOP (loops once) | collectives (ops/arrays) | '
          'compile |\n|' + '---|' * 12)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--dir', default='compile_table', help='where the JSON figures go')
  parser.add_argument('--only', action='append', default=[], help='row names to compile')
  parser.add_argument('--table_only', action='store_true')
  parser.add_argument('--out', default='', help='also write all figures to this JSON file')
  args = parser.parse_args()
  names = [n for n, _ in ROWS]
  unknown = sorted(set(args.only) - set(names))
  if unknown:
    parser.error(f'unknown rows {unknown}; rows: {names}')
  results = {}
  for name, row_args in ROWS:
    if args.only and name not in args.only:
      continue
    path = storage.join(args.dir, f'{name}.json')
    if args.table_only:
      if (figures := storage.read_json(path)) is None:
        continue
      results[name] = figures
    else:
      start = time.perf_counter()
      results[name] = compile_row(name, row_args, args.dir)
      print(f'{name}: {time.perf_counter() - start:.0f} s, load '
            f'{os.getloadavg()[0]:.1f}', file=sys.stderr, flush=True)
  print(HEADER)
  for name, row_args in ROWS:
    if name in results:
      print(table_row(row_args, results[name]))
  if args.out:
    storage.write_json(args.out, results, indent=1)


if __name__ == '__main__':
  main()
