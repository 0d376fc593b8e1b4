"""Against what a user would pick instead: our `rope` model vs Hugging Face Llama in PyTorch.

Run:  .venv/bin/python benchmarks/vs_pytorch.py [--repeats 15] [--cpu_devices 2]
      [--width 512 --heads 8 --ffn 2048 --batch 16]
      (needs the interop extras: .venv/bin/pip install -r requirements-interop.txt)

Both sides train the same architecture at the same shape (default: the tiny preset,
4 layers, width 128, 4 heads, FFN 512, vocab 4096, batch 32 x 128): forward, next-token
loss, backward, global-norm clipping and AdamW. Ours is the project's own training step
(bipe_jax.training, via benchmarks/jax_step.py) with model.position_encoding='rope', once
per attention implementation, data-parallel over `--cpu_devices` single-threaded CPU devices
(default 2, as `train/main.py --cpu_devices=2`; 1 = JAX's default single multi-threaded
device); PyTorch is LlamaForCausalLM (SDPA attention, 2 threads), the same global batch.
All are timed interleaved in one process; the speed-up column is the median over rounds
of step(PyTorch) / step(ours) measured in the same round (> 1: ours is faster).
Results are only written (--out) when the machine was quiet (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top
from benchmarks import jax_step  # pylint: disable=g-import-not-at-top
from benchmarks.hf_llama_step import Shape, make_hf_step  # pylint: disable=g-import-not-at-top

HF = 'PyTorch HF LlamaForCausalLM (sdpa)'


def shape_overrides(shape: Shape) -> dict:
  return {'model.num_layers': shape.layers, 'model.hidden_size': shape.width,
          'model.num_heads': shape.heads, 'model.ffn_size': shape.ffn,
          'model.vocab_size': shape.vocab, 'train.batch_size': shape.batch,
          'data.seq_len': shape.seq, 'model.position_encoding': 'rope'}


def build_candidates(shape: Shape, *, impls=('dense', 'blockwise'), devices=1,
                     threads=2) -> dict:
  """name -> step fn."""
  cands = {}
  for impl in impls:
    ov = {**shape_overrides(shape), 'model.attention_impl': impl,
          'model.block_size': min(shape.seq, 128)}
    name = f'ours: bipe_jax rope ({impl} attention, {devices} CPU device{"s" * (devices > 1)})'
    cands[name] = jax_step.make_project_step('tiny', ov, devices=devices).step
  cands[HF] = make_hf_step(shape, threads=threads)[0]
  return cands


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  for f in dataclasses.fields(Shape):
    p.add_argument(f'--{f.name}', type=int, default=f.default)
  p.add_argument('--impls', default='dense,blockwise')
  p.add_argument('--cpu_devices', type=int, default=2,
                 help='single-threaded CPU devices our step runs data-parallel on (1 = JAX '
                 'default: one device using every core)')
  p.add_argument('--warmup', type=int, default=2)
  p.add_argument('--repeats', type=int, default=15)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  shape = Shape(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Shape)})
  jax_step.use_cpu_devices(args.cpu_devices)
  fns = build_candidates(shape, impls=tuple(args.impls.split(',')), devices=args.cpu_devices)
  cpu = {}
  times = common.interleaved(fns, warmup=args.warmup, repeats=args.repeats, cpu_out=cpu)
  rows, data = [], []
  for name, ts in times.items():
    t = common.median(ts)
    speedup = common.paired_ratio(times, HF, name)
    rows.append([name, common.fmt_ms(t), common.fmt_ms(min(ts)),
                 f'{shape.tokens / t:,.0f}', f'{speedup:.2f}',
                 common.fmt_ms(common.median(cpu[name]))])
    data.append({'name': name, 'times': ts, 'cpu_times': cpu[name],
                 'speedup_vs_pytorch': speedup})
  table = common.markdown_table(
      ['training step', 'median (ms)', 'min (ms)', 'tokens/s', 'speed-up vs PyTorch',
       'CPU time (ms)'], rows)
  common.report(f'Ours vs PyTorch: {shape.describe()}', table,
                [f'{args.repeats} interleaved rounds; speed-up = median of per-round '
                 'step(PyTorch) / step(candidate)',
                 ('our step: JAX\'s single CPU device (XLA\'s own threading)'
                  if args.cpu_devices == 1 else
                  f'our step: data-parallel over {args.cpu_devices} single-threaded CPU devices')
                 + '; PyTorch: 2 intra-op threads'],
                out=args.out, data=data)


if __name__ == '__main__':
  main()
