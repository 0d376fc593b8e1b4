"""What a person watching a run sees: a progress line, TensorBoard events, a metrics file.

Process 0 only writes. Every `log_every` steps:
- stdout: `step 120/600 | loss 4.2113 | 31,204 tok/s | MFU 9.6% | lr 2.00e-03 | ETA 1m32s`
- TensorBoard scalars in `<workdir>/tensorboard` (tensorboardX),
- one JSON line in `<workdir>/metrics.jsonl` (appended across restarts; tests read it).

Throughput is measured between metric fetches, so the first step (compilation) is excluded.
"""

import json
import os
import time

from bipe_jax.training import flops as flops_lib


def format_duration(seconds: float) -> str:
  seconds = max(0, int(round(seconds)))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}h{m:02d}m' if h else (f'{m}m{s:02d}s' if m else f'{s}s')


def format_line(step: int, total: int, metrics: dict) -> str:
  """The one-line progress report."""
  parts = [f'step {step}/{total}', f"loss {metrics['loss']:.4f}"]
  if metrics.get('tokens_per_sec'):
    parts.append(f"{metrics['tokens_per_sec']:,.0f} tok/s")
    parts.append(f"MFU {100 * metrics['mfu']:.1f}%")
  parts.append(f"lr {metrics['learning_rate']:.2e}")
  if metrics.get('eta_sec') is not None:
    parts.append(f"ETA {format_duration(metrics['eta_sec'])}")
  return ' | '.join(parts)


class ProgressLogger:
  """Turns per-step scalars into the progress line, TensorBoard events and metrics.jsonl."""

  def __init__(self, workdir: str, *, total_steps: int, tokens_per_step: int,
               flops_per_token: float, peak_flops: float, log_every: int, enabled: bool):
    self.total_steps = total_steps
    self.tokens_per_step = tokens_per_step
    self.flops_per_token = flops_per_token
    self.peak_flops = peak_flops
    self.log_every = max(1, int(log_every))
    self.enabled = enabled
    self._window_start = None  # (time, step) of the last timing anchor
    self._writer = None
    self._jsonl = None
    if enabled:
      os.makedirs(workdir, exist_ok=True)
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._writer = SummaryWriter(os.path.join(workdir, 'tensorboard'))
      self._jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a', encoding='utf-8')

  def record(self, step: int, scalars: dict) -> dict | None:
    """Called once per finished step (in order) with its host scalars.

    Returns the logged metrics on log steps (and the last step), else None.
    """
    now = time.perf_counter()
    if self._window_start is None:  # first fetched step: includes compilation
      self._window_start = (now, step)
    if step % self.log_every and step != self.total_steps:
      return None
    metrics = {k: float(v) for k, v in scalars.items()}
    metrics['step'] = step
    t0, s0 = self._window_start
    if step > s0 and now > t0:
      rate = (step - s0) * self.tokens_per_step / (now - t0)
      metrics['tokens_per_sec'] = rate
      metrics['mfu'] = flops_lib.mfu(rate, self.flops_per_token, self.peak_flops)
      metrics['eta_sec'] = (self.total_steps - step) * (now - t0) / (step - s0)
      self._window_start = (now, step)
    if self.enabled:
      print(format_line(step, self.total_steps, metrics), flush=True)
      for name, value in metrics.items():
        if name != 'step':
          self._writer.add_scalar(f'train/{name}', value, step)
      self._jsonl.write(json.dumps(metrics) + '\n')
      self._jsonl.flush()
    return metrics

  def event(self, message: str):
    if self.enabled:
      print(message, flush=True)

  def close(self):
    if self._writer is not None:
      self._writer.flush()
      self._writer.close()
    if self._jsonl is not None:
      self._jsonl.close()
