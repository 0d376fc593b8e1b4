"""What a person watching a run sees: a progress line, TensorBoard events, a metrics file.

Process 0 only writes. Every `log_every` steps:
- stdout: `step 120/600 | loss 4.2113 | 31,204 tok/s | MFU 9.6% | lr 2.00e-03 | ETA 1m32s`,
  where `loss` is the mean training loss over the steps since the previous line (one step's loss
  jumps with its batch; the window mean is what shows whether the run learns). metrics.jsonl
  and TensorBoard hold both: `loss` (the window mean) and `step_loss` (the logged step's own);
- TensorBoard scalars in `<workdir>/tensorboard` (event_file.py: written in this thread, so a
  bucket that stops answering stops the run, not a background writer),
- one JSON line in `<workdir>/metrics.jsonl` (appended across restarts, less the lines of the
  steps after the checkpoint a run resumes from: `forget_after`; tests read it).
Every `train.eval_every` steps (`validation`): the validation loss and perplexity on a fixed
slice, as a line `step 300/600 | validation loss 3.4012 | perplexity 30.00 (16,320 tokens)`,
TensorBoard `validation/*` scalars and a metrics.jsonl line with `val_loss`, `val_perplexity`.

Throughput is measured between metric fetches, so the first step (compilation) is excluded.
"""

import json
import math
import os
import time


from bipe_jax import storage
from bipe_jax.training import event_file
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
    if 'mfu' in metrics:
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
    self._loss_sum, self._loss_steps = 0.0, 0  # training loss since the last progress line
    self._writer = None
    self._jsonl = None
    if enabled:
      storage.makedirs(workdir)
      self._writer = event_file.EventFile(os.path.join(workdir, 'tensorboard'))
      self._jsonl_path = os.path.join(workdir, 'metrics.jsonl')
      self._jsonl = storage.open_append(self._jsonl_path)

  def record(self, step: int, scalars: dict) -> dict | None:
    """Called once per finished step (in order) with its host scalars.

    Returns the logged metrics on log steps (and the last step), else None.
    """
    now = time.perf_counter()
    if self._window_start is None:  # first fetched step: includes compilation
      self._window_start = (now, step)
    self._loss_sum += float(scalars['loss'])
    self._loss_steps += 1
    if step % self.log_every and step != self.total_steps:
      return None
    metrics = {k: float(v) for k, v in scalars.items()}
    metrics['step_loss'] = metrics['loss']
    metrics['loss'] = self._loss_sum / self._loss_steps
    metrics['loss_window_steps'] = self._loss_steps
    self._loss_sum, self._loss_steps = 0.0, 0
    metrics['step'] = step
    t0, s0 = self._window_start
    if step > s0 and now > t0:
      rate = (step - s0) * self.tokens_per_step / (now - t0)
      metrics['tokens_per_sec'] = rate
      if self.peak_flops > 0:  # an accelerator without a known peak reports no MFU
        metrics['mfu'] = flops_lib.mfu(rate, self.flops_per_token, self.peak_flops)
      metrics['eta_sec'] = (self.total_steps - step) * (now - t0) / (step - s0)
      self._window_start = (now, step)
    if self.enabled:
      print(format_line(step, self.total_steps, metrics), flush=True)
      for name, value in metrics.items():
        if name != 'step':
          self._writer.add_scalar(f'train/{name}', value, step)
      self._writer.flush()
      self._jsonl.write(json.dumps(metrics) + '\n')
      self._jsonl.flush()
    return metrics

  def validation(self, step: int, nll: float, tokens: int) -> dict:
    """Reports one validation measurement (mean NLL over `tokens` scored targets)."""
    metrics = {'step': step, 'val_loss': nll, 'val_perplexity': math.exp(min(nll, 700.0)),
               'val_tokens': tokens}
    if self.enabled:
      print(f'step {step}/{self.total_steps} | validation loss {nll:.4f} | perplexity '
            f'{metrics["val_perplexity"]:.2f} ({tokens:,} tokens)', flush=True)
      self._writer.add_scalar('validation/loss', nll, step)
      self._writer.add_scalar('validation/perplexity', metrics['val_perplexity'], step)
      self._writer.flush(force=True)  # a validation line is rare, and worth seeing at once
      self._jsonl.write(json.dumps(metrics) + '\n')
      self._jsonl.flush()
    return metrics

  def forget_after(self, step: int) -> int:
    """Drops the metrics.jsonl lines of steps after `step` (a run resumed from checkpoint `step`
    trains them again: each step is then logged once); returns how many were dropped."""
    if not self.enabled:
      return 0
    path = self._jsonl_path
    self._jsonl.close()
    dropped = storage.rewrite_appended(
        path, lambda line: bool(line.strip()) and json.loads(line).get('step', 0) <= step)
    self._jsonl = storage.open_append(path)
    return dropped

  def event(self, message: str):
    if self.enabled:
      print(message, flush=True)

  def close(self):
    if self._writer is not None:
      self._writer.close()
    if self._jsonl is not None:
      self._jsonl.close()
