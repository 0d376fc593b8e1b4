"""What a user would pick instead: one Hugging Face LlamaForCausalLM training step (PyTorch CPU).

Run:  .venv/bin/python benchmarks/hf_llama_step.py [--layers 4 --width 128 --heads 4 --ffn 512
      --vocab 4096 --batch 32 --seq 128]

Needs the interop extras (`pip install -r requirements-interop.txt`: torch==2.13.0 CPU and
transformers); the library and its tests never import torch.

One step = forward + next-token cross-entropy + backward + AdamW update, PyTorch eager with
`torch.set_num_threads(threads)` (2 = this machine's cores). The model has untied
embeddings, no biases, RMSNorm and SwiGLU: the same architecture and parameter count as
our `rope` Transformer at the same shape. benchmarks/vs_pytorch.py imports `make_hf_step`
to interleave it with our JAX step in one process.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=g-import-not-at-top


@dataclasses.dataclass(frozen=True)
class Shape:
  """The shape both sides of the comparison share."""
  layers: int = 4
  width: int = 128
  heads: int = 4
  ffn: int = 512
  vocab: int = 4096
  batch: int = 32
  seq: int = 128

  def __post_init__(self):
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if not isinstance(v, int) or v <= 0:
        raise ValueError(f'Shape.{f.name} must be a positive int, got {v!r}')
    if self.width % self.heads:
      raise ValueError(f'Shape.width ({self.width}) must be divisible by heads ({self.heads})')

  @property
  def tokens(self) -> int:
    return self.batch * self.seq

  def describe(self) -> str:
    return (f'{self.layers} layers, width {self.width}, {self.heads} heads, FFN {self.ffn}, '
            f'vocab {self.vocab}, batch {self.batch} x {self.seq} tokens')


def make_hf_step(shape: Shape, *, threads: int = 2, lr: float = 1e-3,
                 attn_implementation: str = 'sdpa', clip: float = 1.0, seed: int = 0
                 ) -> tuple[Callable[[], float], int]:
  """Builds HF LlamaForCausalLM + AdamW; returns (step() -> loss, parameter count).

  Each call of `step` runs one full training step on a fixed random batch: forward, loss,
  backward, global-norm clipping to `clip` (0 = none; the project's recipe clips at 1.0)
  and the AdamW update.
  """
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit('the PyTorch comparison needs the interop extras: '
                     '.venv/bin/pip install -r requirements-interop.txt') from e
  torch.set_num_threads(threads)
  torch.manual_seed(seed)
  cfg = transformers.LlamaConfig(
      vocab_size=shape.vocab, hidden_size=shape.width, intermediate_size=shape.ffn,
      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
      num_key_value_heads=shape.heads, max_position_embeddings=max(shape.seq, 128),
      rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
      mlp_bias=False, rope_theta=10000.0, attn_implementation=attn_implementation)
  model = transformers.LlamaForCausalLM(cfg)
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
  gen = torch.Generator().manual_seed(seed)
  tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq), generator=gen)

  def step() -> float:
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    if clip > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return float(loss.detach())

  n_params = sum(p.numel() for p in model.parameters())
  return step, n_params


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  for f in dataclasses.fields(Shape):
    p.add_argument(f'--{f.name}', type=int, default=f.default)
  p.add_argument('--threads', type=int, default=2)
  p.add_argument('--attn', default='sdpa', help="'sdpa' or 'eager'")
  p.add_argument('--clip', type=float, default=1.0, help='global-norm clip (0 = none)')
  p.add_argument('--warmup', type=int, default=3)
  p.add_argument('--repeats', type=int, default=10)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  shape = Shape(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Shape)})
  step, n_params = make_hf_step(shape, threads=args.threads, attn_implementation=args.attn,
                                 clip=args.clip)
  times = common.time_fn(step, warmup=args.warmup, repeats=args.repeats)
  t = common.median(times)
  table = common.markdown_table(
      ['model', 'params', 'step (ms)', '+-', 'tokens/s'],
      [[f'HF LlamaForCausalLM ({args.attn}, {args.threads} threads)', f'{n_params / 1e6:.2f}M',
        common.fmt_ms(t), f'{common.spread(times) * 100:.0f}%', f'{shape.tokens / t:,.0f}']])
  common.report(f'PyTorch training step: {shape.describe()}', table, out=args.out,
                data={'shape': dataclasses.asdict(shape), 'times': times})


if __name__ == '__main__':
  main()
