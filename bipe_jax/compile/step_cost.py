"""Planning figures from XLA's TPU cost model: a predicted step time, tokens/s and MFU per chip,
and the hours of a preset's token budget. A model estimate, not a measurement.

A program compiled for a TPU topology carries `cost_analysis()['optimal_seconds']`: the TPU
compiler's own estimate of its run time (e.g. an 8192^2 bfloat16 matmul over four v5e chips is
costed at 1.58 ms, 174 of the 197 TFLOP/s peak). It counts a loop's body once, whatever its
trip count, and the training step is made of loops (scanned layers, the chunked loss, gradient
accumulation, blockwise attention). So the step is costed through two loop-free costing
programs, the step of the same config with

  - 1 and 2 layers, unrolled (`scan_layers=False`): a step of L layers costs
        rest + L * per_layer,   per_layer = c(2) - c(1),   rest = c(1) - per_layer = 2 c(1) - c(2)
    (`scale_by_layers`), where `rest` is everything outside the layers (embedding, loss and its
    gradient, optimizer update, gradient all-reduce);
  - the chunked loss's scan unrolled (bipe_jax/loop_unroll.py), so every chunk is costed;
  - one micro-batch (`batch_size / grad_accum_steps`, no accumulation loop): the step costs
    `grad_accum_steps` micro-steps (the optimizer update is then counted that many times: a
    slight over-estimate);
  - attention on the step's own path: the Pallas kernels, costed by their estimates; blockwise
    attention in one block (`block_size >= seq_len`: the dense masked form, which computes
    every key block where blockwise attention skips those above the diagonal, an over-estimate
    of the attention's share, small at 1024 tokens, large for long rows). When that one-block
    program does not fit (DAPE's [T, T] MLP inputs at the paper's shape), blockwise attention is
    costed in the step's own blocks with its scans unrolled (attention/flash.py), which fits
    wherever the step does; a skipped key block is a `lax.cond` there, costed as its computing
    branch (at 256 tokens in blocks of 64 the attention was costed 3.5x one dense block), and
    the prediction says so.

`while_loops` says how many loops the costing programs still hold (0 for the presets: each
would be counted once, making the prediction a lower bound). A Pallas kernel is costed only
through the `pl.CostEstimate` its pallas_call gives (bipe_jax/attention/pallas/).
"""

import contextlib
import dataclasses
import time
from typing import Callable, Optional

from bipe_jax import schemes
from bipe_jax.attention import support as attention_support
from bipe_jax.compile import aot
from bipe_jax.training import flops as flops_lib
from bipe_jax import loop_unroll

COSTING_LAYERS = (1, 2)
_now = time.monotonic  # the progress lines' clock
LABEL = 'XLA TPU cost model estimate, not a measurement'


def scale_by_layers(seconds_1: float, seconds_2: float, num_layers: int) -> tuple[float, float]:
  """(rest, per_layer) seconds from the 1- and 2-layer costs; the L-layer step costs
  rest + L * per_layer."""
  per_layer = seconds_2 - seconds_1
  return seconds_1 - per_layer, per_layer


@dataclasses.dataclass
class StepPrediction:
  """The predicted training step of one config on one topology (all figures per chip)."""
  topology: str
  device_kind: str
  num_devices: int
  num_layers: int
  grad_accum_steps: int
  seconds: tuple  # optimal_seconds of the costing programs, by COSTING_LAYERS
  flops: tuple  # XLA's FLOPs of the costing programs, by COSTING_LAYERS
  while_loops: int  # loops left in the costing programs (each counted once)
  tokens_per_step: int  # global: batch_size x seq_len
  model_flops_per_chip: float  # training/flops.py's model FLOPs per step, per chip
  peak_flops: float  # per chip (0 = unknown: no MFU)
  train_steps: int  # the preset's train.steps
  # blockwise attention costed 'in one block' or 'in its own blocks' ('' for the other paths)
  attention_costing: str = ''

  @property
  def rest_seconds(self) -> float:
    return scale_by_layers(self.seconds[0], self.seconds[1], self.num_layers)[0]

  @property
  def per_layer_seconds(self) -> float:
    return scale_by_layers(self.seconds[0], self.seconds[1], self.num_layers)[1]

  @property
  def step_seconds(self) -> float:
    return self.grad_accum_steps * (self.rest_seconds + self.num_layers * self.per_layer_seconds)

  @property
  def xla_flops_per_chip(self) -> float:
    """XLA's FLOPs of the whole step per chip, scaled the same way (a cross-check of the model
    FLOPs: it counts remat's recomputation and the attention's masked blocks too)."""
    rest, per_layer = scale_by_layers(self.flops[0], self.flops[1], self.num_layers)
    return self.grad_accum_steps * (rest + self.num_layers * per_layer)

  @property
  def tokens_per_second_per_chip(self) -> float:
    return self.tokens_per_step / self.num_devices / self.step_seconds

  @property
  def mfu(self) -> float:
    if not self.peak_flops:
      return 0.0
    return self.model_flops_per_chip / self.step_seconds / self.peak_flops

  @property
  def budget_tokens(self) -> int:
    return self.train_steps * self.tokens_per_step

  @property
  def budget_hours(self) -> float:
    return self.train_steps * self.step_seconds / 3600.0

  def to_json(self) -> dict:
    out = dataclasses.asdict(self)
    for name in ('rest_seconds', 'per_layer_seconds', 'step_seconds', 'xla_flops_per_chip',
                 'tokens_per_second_per_chip', 'mfu', 'budget_tokens', 'budget_hours'):
      out[name] = getattr(self, name)
    out['label'] = LABEL
    return out


def runs_blockwise_on_tpu(config) -> bool:
  """True when the config's attention is blockwise on a TPU ('auto' resolved for its scheme)."""
  m = config.model
  impl = attention_support.resolve_attention_impl(
      str(m.attention_impl), schemes.get_scheme(str(m.position_encoding)), 'tpu', str(m.dtype),
      bool(m.get('causal', True)))
  return impl == 'blockwise'


def costing_config(config, num_layers: int, *, one_block: bool = False):
  """`config` made loop-free for the cost model (see the module docstring), with `num_layers`
  unrolled layers; `one_block`: blockwise attention in one block of the whole row."""
  c = config.copy_and_resolve_references()
  with c.unlocked() if hasattr(c, 'unlocked') else contextlib.nullcontext():
    m, t = c.model, c.train
    m.num_layers = int(num_layers)
    m.scan_layers = False
    if one_block and runs_blockwise_on_tpu(c):
      m.block_size = max(int(m.block_size), int(c.data.seq_len))
    accum = int(t.grad_accum_steps)
    t.batch_size = int(t.batch_size) // accum
    t.grad_accum_steps = 1
  return c


class CostingError(ValueError):
  """The costing programs gave no prediction; the message is one line."""


def predict(config, topology: str, devices: list, *, num_slices: int = 1,
            progress: Optional[Callable[[str], None]] = None) -> StepPrediction:
  """Compiles the two costing programs of `config` for `devices` and scales them (one line
  CostingError when the TPU compiler gives no cost or refuses a program). `progress(line)`
  hears which program is being compiled and the time so far, before and after each."""
  seconds, xla_flops, loops = [], [], 0
  start = _now()
  say = progress or (lambda line: None)
  one_block = runs_blockwise_on_tpu(config)  # first the one-block form (module docstring)
  n = 0
  while n < len(COSTING_LAYERS):
    layers = COSTING_LAYERS[n]
    n += 1
    say(f'predicting: compiling costing program {n} of {len(COSTING_LAYERS)} ({layers} '
        f'unrolled layer{"s" if layers > 1 else ""}'
        f'{", attention in one block" if one_block else ""}); {_now() - start:.0f} s so far')
    began = _now()
    with loop_unroll.unrolled():
      report = aot.compile_for_topology(costing_config(config, layers, one_block=one_block),
                                        topology, num_slices=num_slices, devices=devices)
    say(f'predicting: costing program {n} of {len(COSTING_LAYERS)} compiled in '
        f'{_now() - began:.0f} s; {_now() - start:.0f} s so far')
    step = report.steps[0]
    if step.out_of_memory and one_block:  # again in the step's own blocks, from the start
      say('predicting: attention in one block does not fit; costing the step\'s own blocks')
      one_block, n = False, 0
      seconds, xla_flops, loops = [], [], 0
      continue
    if step.out_of_memory:
      raise CostingError(f'the {layers}-layer costing program does not fit '
                         f'({step.out_of_memory[:200]})')
    if step.optimal_seconds <= 0:
      raise CostingError(f'the compiler gave no optimal_seconds for {report.device_kind} '
                         '(a TPU topology has it)')
    seconds.append(step.optimal_seconds)
    xla_flops.append(step.flops)
    loops += step.while_loops
  t, m = config.train, config.model
  tokens = int(t.batch_size) * int(config.data.seq_len)
  model_config = aot.resolve(config, len(devices)).model
  model_flops = (flops_lib.train_flops_per_token(model_config, int(config.data.seq_len))
                 * tokens / len(devices))
  peak, _ = flops_lib.peak_flops_per_device(report.device_kind, 'tpu', m.dtype,
                                            float(t.get('peak_flops_per_device', 0.0)))
  return StepPrediction(
      topology=topology, device_kind=report.device_kind, num_devices=len(devices),
      num_layers=int(m.num_layers), grad_accum_steps=int(t.grad_accum_steps),
      seconds=tuple(seconds), flops=tuple(xla_flops), while_loops=loops,
      tokens_per_step=tokens, model_flops_per_chip=model_flops, peak_flops=peak,
      train_steps=int(t.steps),
      attention_costing=(('in one block' if one_block else 'in its own blocks')
                         if runs_blockwise_on_tpu(config) else ''))


def format_prediction(p: StepPrediction) -> str:
  """The planning lines train/compile.py prints under the memory table."""
  lines = [f'predicted step ({LABEL}):',
           f'  step time           {p.step_seconds * 1e3:10.4g} ms   (rest '
           f'{p.rest_seconds * 1e3:.4g} ms + {p.num_layers} layers x '
           f'{p.per_layer_seconds * 1e3:.4g} ms'
           + (f', x {p.grad_accum_steps} micro-batches' if p.grad_accum_steps > 1 else '')
           + f'; costed from 1 and 2 unrolled layers: {p.seconds[0] * 1e3:.4g} / '
           f'{p.seconds[1] * 1e3:.4g} ms)',
           f'  tokens/s per chip   {p.tokens_per_second_per_chip:10.0f}      '
           f'({p.tokens_per_second_per_chip * p.num_devices:.0f} on the slice)',
           f'  MFU per chip        '
           + (f'{100 * p.mfu:9.1f} %      (model FLOPs {p.model_flops_per_chip / 1e12:.4g} '
              f'TFLOP per chip per step / {p.peak_flops / 1e12:.0f} TFLOP/s peak)'
              if p.peak_flops else '         -      (no published peak for this chip)'),
           f'  XLA TFLOPs per chip {p.xla_flops_per_chip / 1e12:10.4g}      (scaled like the '
           f'time; model FLOPs {p.model_flops_per_chip / 1e12:.4g})',
           f'  token budget        {p.budget_tokens / 1e9:10.2f} B    ({p.train_steps} steps '
           f'x {p.tokens_per_step} tokens) in {p.budget_hours:.4g} hours on {p.topology}']
  if p.attention_costing == 'in its own blocks':
    lines.append('  note: blockwise attention did not fit in one block and was costed in its own '
                 'blocks, every key block counted (an over-estimate of its share)')
  if p.while_loops:
    lines.append(f'  note: the costing programs still hold {p.while_loops} loop(s), each '
                 'counted once: the step time is a lower bound')
  return '\n'.join(lines)
