"""The training loop as steps plus periodic actions (validation, checkpoint, preemption), the way
Levanter's hooks and clu's periodic actions organise it.

  loop = TrainLoop(step_fn, next_batch, scalars, actions, should_stop)
  end = loop.run(state, start_step, total_steps)   # LoopEnd(state, step, exhausted, stopped)

Per step N: take the batch, dispatch step N, hand its device scalars to `Scalars` (which
fetches step N-1's: the host never waits for the device except when an action needs this
step's scalars), ask `should_stop(N)`, then run every action due at N in order. An action that
`needs_scalars` gets this step's scalars fetched (and checked) before it runs. After a stop
request the due actions run and the loop ends.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional


@dataclasses.dataclass(frozen=True)
class StepInfo:
  step: int
  state: Any  # the train state after this step
  last: bool  # the final step of the run (train.steps)
  stopping: bool  # a stop was requested (preemption): this is the last step of this call


@dataclasses.dataclass(frozen=True)
class LoopEnd:
  state: Any
  step: int  # the step reached
  exhausted: bool  # the data ran out before total_steps
  stopped: bool  # a stop was requested (preemption)


@dataclasses.dataclass
class PeriodicAction:
  """`run(info)` every `every` steps (0 = never by period), at the last step (`at_end`) and at
  a stop request (`on_stop`)."""
  name: str
  run: Callable[[StepInfo], None]
  every: int = 0
  at_end: bool = False
  on_stop: bool = False
  needs_scalars: bool = False  # fetch this step's scalars before running

  def due(self, info: StepInfo) -> bool:
    return bool((self.every and info.step % self.every == 0) or (self.at_end and info.last)
                or (self.on_stop and info.stopping))


class Scalars:
  """Device scalars of dispatched steps, fetched one step late: `consume(step, host_scalars)`
  sees each step once, in order."""

  def __init__(self, consume: Callable[[int, dict], None], fetch: Callable[[Any], dict]):
    self._consume, self._fetch = consume, fetch
    self._pending: Optional[tuple[int, Any]] = None

  def push(self, step: int, device_scalars) -> bool:
    """Queues `step`'s scalars after consuming the previous step's; True if one was waiting."""
    waited = self._pending is not None
    self.flush()
    self._pending = (step, device_scalars)
    return waited

  def flush(self):
    if self._pending is not None:
      step, device_scalars = self._pending
      self._pending = None
      self._consume(step, self._fetch(device_scalars))


@dataclasses.dataclass
class TrainLoop:
  step_fn: Callable  # (state, batch) -> (state, device scalars)
  next_batch: Callable[[], Any]  # raises StopIteration when the data ends
  scalars: Scalars
  actions: list
  should_stop: Callable[[int], bool]
  on_first_dispatch: Callable[[], None] = lambda: None

  def run(self, state, start_step: int, total_steps: int) -> LoopEnd:
    step = start_step
    for step in range(start_step + 1, total_steps + 1):
      try:
        batch = self.next_batch()
      except StopIteration:  # a finite data.num_epochs ran out before train.steps
        self.scalars.flush()
        return LoopEnd(state, step - 1, exhausted=True, stopped=False)
      state, device_scalars = self.step_fn(state, batch)
      if not self.scalars.push(step, device_scalars) and step == start_step + 1:
        self.on_first_dispatch()
      info = StepInfo(step=step, state=state, last=step == total_steps,
                      stopping=self.should_stop(step))
      for action in self.actions:
        if action.due(info):
          if action.needs_scalars:
            self.scalars.flush()
          action.run(info)
      if info.stopping:
        self.scalars.flush()
        return LoopEnd(state, step, exhausted=False, stopped=True)
    self.scalars.flush()
    return LoopEnd(state, step, exhausted=False, stopped=False)
