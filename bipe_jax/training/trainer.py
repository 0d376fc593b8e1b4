"""The training loop: validate, build, restore or initialise, step, log, checkpoint.

    result = train(config, workdir)

Order of work per step N: fetch this process's rows, assemble the global batch, dispatch
step N, and only then fetch step N-1's scalars (so the host never waits for the device
except at checkpoints). Before a checkpoint the step's own scalars are checked, so a saved
checkpoint never holds a state reached through a NaN/Inf loss. A non-finite loss stops the
run with `NonFiniteLossError` and the last good checkpoint stays the latest one.

Preemption: SIGTERM or SIGINT (single process) or JAX's preemption sync point (multi-process)
makes the loop save a checkpoint at the step it has reached and return cleanly.
"""

import dataclasses
import math
import os
import signal
import sys
import threading
from typing import Callable, Optional

import flax.linen as nn
import jax
from absl import logging
import orbax.checkpoint as ocp

from bipe_jax import run_config as run_config_lib
from bipe_jax.runs import tokenizer as run_tokenizer
from bipe_jax import storage
from bipe_jax import storage_faults
from bipe_jax.state import checkpointing
from bipe_jax.training import data_shards as data_shards_lib
from bipe_jax.training import data_loading
from bipe_jax.training import flops as flops_lib
from bipe_jax.training import init_from as init_from_lib
from bipe_jax.training import init_from_shapes
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.runs import position_stats
from bipe_jax.training import progress
from bipe_jax.training import resolve as resolve_lib
from bipe_jax.training import setup as setup_lib
from bipe_jax.runs import run_record
from bipe_jax.training import train_loop
from bipe_jax.training import validation
from bipe_jax.runs import workdir_lock


class NonFiniteLossError(RuntimeError):
  """The loss or gradient norm became NaN/Inf; the message says which step and checkpoint."""


@dataclasses.dataclass
class TrainResult:
  step: int  # the step the run reached
  start_step: int  # the step it resumed from (0 = fresh)
  losses: dict  # {step: loss} of the steps this call ran
  preempted: bool
  checkpoint_steps: list
  stop_signal: Optional[str] = None  # 'SIGTERM' / 'SIGINT' when preempted by a signal


class _Preemption:
  """SIGTERM or SIGINT (Ctrl-C) -> a flag the loop polls (single process); JAX's SIGTERM sync
  point on multi-host (where a Ctrl-C stays a KeyboardInterrupt: the processes must agree on
  the step to save at, which only JAX's preemption notifier arranges).

  `signal_name` is the signal that stopped the run (None on multi-host: JAX's sync point does
  not say)."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, checkpointer: checkpointing.Checkpointer):
    self._flag = threading.Event()
    self._checkpointer = checkpointer
    self._previous = {}
    self._multi = jax.process_count() > 1
    self._deadline = None
    self._grace_s = stop_grace_s()
    self.signal_name = None
    if not self._multi and threading.current_thread() is threading.main_thread():
      for signum in self.SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)

  def _handle(self, signum, _):
    self.signal_name = signal.Signals(signum).name
    self._flag.set()
    if self._deadline is None:  # the first signal: the run has STOP_GRACE_S to save and end
      self._deadline = threading.Timer(self._grace_s, self._give_up)
      self._deadline.daemon = True
      self._deadline.start()

  def _give_up(self):
    """The run did not end within the grace after the signal (a checkpoint save waiting on a
    bucket that does not answer): one line, and the process ends now with EXIT_STORAGE."""
    from bipe_jax.cli import EXIT_STORAGE  # pylint: disable=g-import-not-at-top
    kept = self._checkpointer.last_saved_text()
    sys.stdout.flush()
    print(f'error: still running {self._grace_s:.0f} s after {self.signal_name}: the '
          f'checkpoint save did not finish (is the storage answering?); exiting without it; '
          f'{kept}', file=sys.stderr, flush=True)
    os._exit(EXIT_STORAGE)  # pylint: disable=protected-access

  def reached(self, step: int) -> bool:
    if self._multi:
      return self._checkpointer.reached_preemption(step)
    return self._flag.is_set()

  def close(self):
    """Restores the signal handlers and disarms the deadline: called last, once the run's
    checkpoint and files are closed."""
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    if self._deadline is not None:
      self._deadline.cancel()


STOP_GRACE_ENV = 'BIPE_JAX_STOP_GRACE_S'
DEFAULT_STOP_GRACE_S = 180.0


def stop_grace_s(environ=None) -> float:
  """Seconds a run may take to save and end after SIGTERM / Ctrl-C (STOP_GRACE_ENV, default
  DEFAULT_STOP_GRACE_S) before it exits without its checkpoint; a bad value is a ValueError."""
  environ = os.environ if environ is None else environ
  text = environ.get(STOP_GRACE_ENV, '').strip()
  if not text:
    return DEFAULT_STOP_GRACE_S
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if value <= 0:
    raise ValueError(f'{STOP_GRACE_ENV}={text!r}: must be a number of seconds > 0')
  return value


# How long the other processes wait at a barrier for process 0 (which prepares the data first:
# tokenizing a corpus can take hours on a pod's first run).
BARRIER_TIMEOUT_S = 6 * 3600


def _barrier(name: str, timeout_s: float = BARRIER_TIMEOUT_S):
  """Every process waits here for the others: a barrier of the coordination service (Orbax's
  `get_barrier_sync_fn`, `jax.distributed`'s client), not a collective. A collective barrier
  (`multihost_utils.sync_global_devices`) fails on CPU when one process arrives 30 s after the
  others (gloo's context set-up times out), e.g. while process 0 still prepares the data."""
  if jax.process_count() > 1:
    ocp.multihost.get_barrier_sync_fn()(key=name, timeout_ms=int(timeout_s * 1000))


def _default_data(config, facts: dict, workdir: str):
  """The data pipeline's make_iterator; prepares the data, pins the run's own copy of the
  tokenizer (bipe_jax.runs.tokenizer) and loads it, adding both to `facts`."""
  from bipe_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  try:  # the data pipeline's ValueErrors are about config.data (missing dataset, bad path)
    if jax.process_index() == 0:
      data_lib.prepare(config.data)
    _barrier('bipe_jax_prepare')
    if jax.process_index() != 0:
      data_lib.prepare(config.data)
    facts['tokenizer_pin'] = run_tokenizer.pin_for_training(config.data, workdir)
    facts['tokenizer'] = data_lib.get_tokenizer(
        resolve_lib.resolve(config, **facts).to_config_dict().data)  # the pinned copy
  except ValueError as e:
    raise run_config_lib.ConfigError(' '.join(str(e).split())) from None
  return data_lib.make_train_iterator


def _segment_statistics(workdir: str, resolved: run_config_lib.RunConfig,
                        make_iterator) -> tuple[Optional[int], Optional[str]]:
  """(an inter-stream rope_original_length to resolve with, or None; the line saying where it
  came from, or None). `resolved`: separator ids resolved.

  A fresh bipe_* run records the segment statistics of its training rows
  (position_stats.json, read by runs fine-tuned from it); see bipe_jax.runs.position_stats.
  """
  if not resolved.model.scheme.bilevel:
    return None, None
  cache = {}

  def own_stats():
    if 'stats' not in cache:
      cache['stats'] = position_stats.read(workdir) or position_stats.measure(
          resolved.to_config_dict().data, resolved.model, make_iterator)
    return cache['stats']

  length = message = None
  if position_stats.needs_inter_original_length(dataclasses.asdict(resolved.model)):
    length, source = position_stats.inter_original_length(workdir, resolved.train.init_from,
                                                          own_stats)
    message = (f'model.rope_original_length = {source}, for {resolved.model.rope_scaling} on '
               'the inter stream')
  if jax.process_index() == 0 and position_stats.read(workdir) is None:
    position_stats.write(workdir, own_stats())
  return length, message


def _check_finite(step: int, scalars: dict, last_good: Optional[int], directory: str):
  loss, grad_norm = float(scalars['loss']), float(scalars['grad_norm'])
  if math.isfinite(loss) and math.isfinite(grad_norm):
    return
  kept = (f'the last good checkpoint is step {last_good} in {directory}' if last_good is not None
          else 'no checkpoint was saved yet')
  raise NonFiniteLossError(
      f'loss is {loss} (gradient norm {grad_norm}) at step {step}: stopping; {kept}. '
      f'Lower train.learning_rate, raise train.warmup_steps or check the data.')


def train(config, workdir: str, *, model: Optional[nn.Module] = None,
          make_iterator: Optional[Callable] = None) -> TrainResult:
  """Trains `config` in `workdir`, resuming from its latest checkpoint if there is one.

  Args:
    config: the ml_collections config (configs/base.py sections).
    workdir: checkpoints, TensorBoard events, metrics.jsonl and config.json go here.
    model: a linen module mapping tokens [B, T] -> logits [B, T, V]; default the project's
      Transformer built from config.model (separators resolved from the tokenizer).
    make_iterator: `(data_config, rows, shard, num_shards) -> iterator` with
      get_state/set_state; default `bipe_jax.data.make_train_iterator`.
  Raises:
    run_config_lib.ConfigError: a bad config value (one line).
    NonFiniteLossError: the loss became NaN/Inf.
    workdir_lock.WorkdirInUseError: another process is training in `workdir`.
  """
  early = resolve_lib.resolve(config, device_count=jax.device_count())  # checks, before any I/O
  facts = dict(device_count=jax.device_count(),
               init_source_seq_len=init_from_lib.source_seq_len(early.train.init_from))
  if not checkpointing.step_dirs(early.checkpoint.directory(workdir)):
    checked = early.to_config_dict()
    try:  # before anything is written (a resumed run ignores train.init_from)
      init_from_lib.check_source(checked)
      init_from_shapes.check_param_shapes(checked, model)
    except init_from_lib.InitFromError as e:
      raise run_config_lib.ConfigError(str(e)) from None
  with workdir_lock.hold(workdir, enabled=jax.process_index() == 0):
    return _train(config, early, facts, workdir, model=model, make_iterator=make_iterator)


def steps_to_train(start_step: int, total_steps: int) -> str:
  """'training steps 5..20', or for a finished run what to do instead of an empty range."""
  if start_step < total_steps:
    return f'training steps {start_step + 1}..{total_steps}'
  return (f'nothing to train: the run is at step {start_step} of train.steps={total_steps} '
          '(raise --config.train.steps to train further)')


def attention_choice(configured: str, chosen: str) -> str:
  """'pallas (auto on this platform)' or 'blockwise' (set by the config): the start line's
  words for the attention implementation the step runs."""
  return f'{chosen} (auto on this platform)' if configured == 'auto' else chosen


def _train(config, early: run_config_lib.RunConfig, facts: dict, workdir: str, *,
           model: Optional[nn.Module], make_iterator: Optional[Callable]) -> TrainResult:
  """`train` once its config is checked (`early`: resolved without the facts read from the
  data), with the workdir's lock held. `facts`: what resolve_lib.resolve takes besides the
  config, completed here."""
  mesh = mesh_lib.make_mesh(early.mesh)
  data_slice = mesh_lib.process_data_shard(mesh, early.train.batch_size)
  ckpt_dir = early.checkpoint.directory(workdir)
  num_shards, shards_message = data_shards_lib.resolve_data_shards(early.train, data_slice[1],
                                                                   ckpt_dir)
  if shards_message:  # adopted from the checkpoint: the run records it
    facts['data_shards'] = num_shards

  stats_message = None
  if make_iterator is None:
    make_iterator = _default_data(config, facts, workdir)
    facts['inter_original_length'], stats_message = _segment_statistics(
        workdir, resolve_lib.resolve(config, **facts), make_iterator)
  resolved = resolve_lib.resolve(config, **facts)
  recorded = resolved.to_config_dict()  # config.json, and the readers of a ConfigDict
  t, seq_len = resolved.train, resolved.data.seq_len

  is_main = jax.process_index() == 0
  converted = checkpointing.params_only_step(ckpt_dir)
  if converted is not None:
    raise run_config_lib.ConfigError(
        f'{ckpt_dir} holds parameters only (a converted model, step {converted}), not a '
        f'training run to resume: fine-tune from it in a new workdir with '
        f'--config.train.init_from={workdir}')
  try:
    run_record.check_resume(workdir, recorded, checkpointing.step_dirs(ckpt_dir))
  except run_record.ResumeMismatchError as e:
    raise run_config_lib.ConfigError(str(e)) from None
  if is_main:
    storage.makedirs(workdir)

  setup = setup_lib.build(resolved, mesh, model=model)
  model, shardings = setup.model, setup.shardings
  # model.attention_impl='auto' is resolved for the mesh's platform (platform_choices.py):
  # config.json and the start line record the implementation the step runs
  chosen_impl = getattr(getattr(model, 'config', None), 'attention_impl', None)
  if chosen_impl:
    recorded.model.attention_impl = chosen_impl
  checkpointer = checkpointing.Checkpointer(
      ckpt_dir, every_steps=resolved.checkpoint.every_steps, keep=resolved.checkpoint.keep,
      async_save=resolved.checkpoint.async_save)
  preemption = _Preemption(checkpointer)  # SIGTERM from here on: save at the next step
  logger = None
  try:
    loader = data_loading.ShardedDataLoader(
        make_iterator, recorded.data, global_batch_size=t.batch_size, num_shards=num_shards,
        process_slice=data_slice)

    device = jax.devices()[0]
    peak, peak_source = flops_lib.peak_flops_per_device(
        device.device_kind, device.platform, resolved.model.dtype, t.peak_flops_per_device)
    logger = progress.ProgressLogger(
        workdir, total_steps=t.steps, tokens_per_step=t.batch_size * seq_len,
        flops_per_token=flops_lib.train_flops_per_token(resolved.model, seq_len),
        peak_flops=peak * (jax.process_count() if device.platform == 'cpu'
                           else jax.device_count()),
        log_every=t.log_every, enabled=is_main)

    try:
      validation_slice = validation.make_validation_slice(recorded)
    except validation.ValidationSliceError as e:
      raise run_config_lib.ConfigError(str(e)) from None

    logging.info('built data loader and checkpointer; restoring')
    restored = checkpointer.restore_latest(
        setup.target(), allow_fresh_start=resolved.checkpoint.allow_fresh_start)
    if restored is not None:
      start_step, state, data_state = restored
      if data_state is not None:  # None: a train state saved without a data position
        loader.set_state(data_state)
      logger.event(f'resumed from checkpoint step {start_step} in {ckpt_dir}'
                   + (' (train.init_from is used only by a fresh run)'
                      if t.init_from else ''))
    else:
      state, _ = setup.fresh_state(t.seed)
      start_step = 0
      if t.init_from:
        try:
          state, source = init_from_lib.with_source_params(
              state, t.init_from, shardings.params,
              separator_ids=resolved.model.separator_ids)
        except init_from_lib.InitFromError as e:
          raise run_config_lib.ConfigError(str(e)) from None
        logger.event(f'parameters from {source}; optimizer state fresh, step 0')
    logger.forget_after(start_step)  # steps past the checkpoint are trained (logged) again
    logging.info('train state ready')
    if is_main:  # only now: a failed restore never replaces the record of what was trained
      run_record.write_config(workdir, recorded)
    logger.event(f'mesh {dict(mesh.shape)} on {jax.device_count()} devices, '
                 f'{jax.process_count()} processes; {steps_to_train(start_step, t.steps)}'
                 + (f'; attention {attention_choice(resolved.model.attention_impl, chosen_impl)}'
                    if chosen_impl else ''))
    logger.event(f'MFU is measured against {peak_source}')
    if shards_message:
      logger.event(shards_message)
    if stats_message:
      logger.event(stats_message)
    record = _Record(logger, checkpointer, loader, ckpt_dir,
                     last_good=start_step if restored is not None else None,
                     signal_name=lambda: preemption.signal_name or 'SIGTERM')
    loop = train_loop.TrainLoop(
        step_fn=setup.step_fn,
        next_batch=lambda: mesh_lib.global_batch(next(loader), mesh, t.batch_size),
        scalars=train_loop.Scalars(record.consume, jax.device_get),
        actions=_periodic_actions(resolved, record, validation_slice, model, mesh),
        should_stop=preemption.reached,
        on_first_dispatch=lambda: logging.info('first step dispatched'))
    with setup.context():
      end = loop.run(state, start_step, t.steps)
      if end.exhausted:
        record.data_ended(end, start_step, resolved)
  finally:
    _close_after_run(preemption, checkpointer, logger, ckpt_dir, failure=sys.exc_info()[1])
  return TrainResult(step=end.step, start_step=start_step, losses=record.losses,
                     preempted=end.stopped, checkpoint_steps=record.saved,
                     stop_signal=record.signal_name() if end.stopped else None)


def _close_after_run(preemption, checkpointer, logger, ckpt_dir: str, *,
                     failure: Optional[BaseException]):
  """Ends a run: the save in flight waited for (CheckpointSaveError when it failed), the
  progress files closed, the signal handlers back. When the run is already failing (`failure`),
  each is closed as far as it goes and its own error goes to the library log: the run reports
  the first failure, in one line; a bucket that stopped answering gets the checkpoint the run
  can resume from added to its line."""
  storage_down = isinstance(failure, storage_faults.StorageUnreachableError)
  # a save in flight writes to the storage that stopped answering: not waited for (up to the
  # save timeout), the step it saves is named in the line as one that may have completed
  closers = ([checkpointer.abandon if storage_down else checkpointer.close]
             + ([logger.close] if logger else []) + [preemption.close])
  error = None
  for close in closers:
    try:
      close()
    except Exception as e:  # pylint: disable=broad-except
      if failure is not None or error is not None:
        logging.info('closing %s after a failure', close, exc_info=True)
      else:
        error = e
  if storage_down:
    kept = checkpointer.last_saved_text(ckpt_dir)
    raise storage_faults.StorageUnreachableError(
        f'{failure}; stopping: {kept}, and running the same command resumes from it once the '
        'storage answers') from None
  if error is not None:
    raise error


class _Record:
  """What the loop's actions keep: losses by step (each step's scalars checked for NaN/Inf and
  logged), the checkpoint steps, the last step saved from a good state."""

  def __init__(self, logger, checkpointer, loader, ckpt_dir: str, last_good: Optional[int],
               signal_name: Callable[[], str]):
    self.logger, self.checkpointer, self.loader, self.ckpt_dir = (logger, checkpointer, loader,
                                                                  ckpt_dir)
    self.signal_name = signal_name  # the signal that stopped the run
    self.losses = {}
    self.saved = list(checkpointer.all_steps())
    self.last_good = last_good

  def consume(self, step: int, scalars: dict):
    self.checkpointer.poll()  # a failed background save stops the run at once
    _check_finite(step, scalars, self.last_good, self.ckpt_dir)
    self.losses[step] = float(scalars['loss'])
    self.logger.record(step, scalars)

  def save(self, info: train_loop.StepInfo):
    if self.checkpointer.save(info.step, info.state, self.loader.get_state(), force=True):
      self.saved.append(info.step)
    self.last_good = info.step

  def stopped(self, info: train_loop.StepInfo):
    self.logger.event(f'preempted ({self.signal_name()}) at step {info.step}: checkpoint saved '
                      f'in {self.ckpt_dir}; exiting. Run the same command to resume.')

  def data_ended(self, end: train_loop.LoopEnd, start_step: int, config):
    """A finite data.num_epochs ran out before train.steps: save the step reached, say so."""
    step, t = end.step, config.train
    if step > start_step and step not in self.saved:
      self.save(train_loop.StepInfo(step, end.state, last=False, stopping=False))
    self.logger.event(
        f'the training data ended after data.num_epochs={config.data.num_epochs} '
        f'epoch(s), at step {step} of {t.steps}: {step * t.batch_size * config.data.seq_len:,} '
        f'tokens trained on in {step} steps; final checkpoint at step {step} in {self.ckpt_dir}')


def _periodic_actions(config, record: _Record, validation_slice, model, mesh) -> list:
  """In order at a step: validation (every train.eval_every and at the end), checkpoint (every
  checkpoint.every_steps, at the end and on preemption), the preemption notice."""
  actions = []
  if validation_slice is not None:
    actions.append(train_loop.PeriodicAction(
        'validation', every=config.train.eval_every, at_end=True, needs_scalars=True,
        run=lambda info: record.logger.validation(
            info.step, *validation_slice.evaluate(model, info.state.params, mesh))))
  return actions + [
      train_loop.PeriodicAction('checkpoint', record.save, every=config.checkpoint.every_steps,
                                at_end=True, on_stop=True, needs_scalars=True),
      train_loop.PeriodicAction('preemption', record.stopped, on_stop=True),
  ]
