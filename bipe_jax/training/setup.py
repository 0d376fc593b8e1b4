"""One set-up for a training run: the model, optimizer, schedule, abstract state, shardings and
the jitted step, built once from a resolved config and a mesh.

    run = resolve.resolve(config, device_count=..., tokenizer=...)   # training/resolve.py
    setup = build(run, mesh)               # or build(run, mesh, model=...)
    state, _ = setup.fresh_state(seed)     # or checkpointer.restore(step, setup.target())
    with setup.context():
      state, scalars = setup.step_fn(state, batch)

Training (trainer.py), the ahead-of-time compile (compile/aot.py) and resuming from a
checkpoint all use it. Evaluation, generation and conversion build no optimizer: they restore
parameters only (runs/restore.py, `train_state.param_shardings`).
"""

import dataclasses
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import optax

from bipe_jax import config as model_config_lib
from bipe_jax import platform_choices
from bipe_jax import model as model_lib
from bipe_jax import run_config as run_config_lib
from bipe_jax.state import optimizer as optimizer_lib
from bipe_jax.state import train_state as train_state_lib
from bipe_jax.training import train_step as train_step_lib


@dataclasses.dataclass(frozen=True)
class Setup:
  """What one training run is made of. `model` has its kernels resolved for `mesh`."""
  config: run_config_lib.RunConfig  # as resolved (training/resolve.py)
  mesh: jax.sharding.Mesh
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract: train_state_lib.TrainState  # shapes / dtypes (jax.ShapeDtypeStruct leaves)
  shardings: train_state_lib.TrainState  # NamedSharding leaves
  step_fn: Callable  # (state, {'tokens': [B, T]}) -> (state, scalars), jitted, state donated

  @property
  def seq_len(self) -> int:
    return self.config.data.seq_len

  def target(self) -> train_state_lib.TrainState:
    """The abstract state with its shardings: what a checkpoint restores onto."""
    return train_state_lib.abstract_with_shardings(self.abstract, self.shardings)

  def fresh_state(self, seed: int) -> tuple[train_state_lib.TrainState, Any]:
    """(state, shardings): a freshly initialised train state, laid out on the mesh."""
    return train_state_lib.create_train_state(self.model, self.tx, self.mesh, self.seq_len, seed,
                                              shardings=self.shardings)

  def context(self):
    """The mesh and logical-axis rules to trace and run the step under."""
    return train_state_lib.mesh_context(self.mesh)


def build(resolved: run_config_lib.RunConfig, mesh: jax.sharding.Mesh, *,
          model: Optional[nn.Module] = None) -> Setup:
  """The set-up of `resolved` (training/resolve.py, every field resolved) on `mesh`.

  The project's Transformer of resolved.model (ValueError naming the field when one resolved
  at start is not: separator ids, an inter-stream RoPE original length), or `model`: any linen
  module tokens [B, T] -> logits [B, T, V].
  """
  t = resolved.train
  if model is None:
    model_config_lib.validate_model_config(resolved.model)  # resolved: no check relaxed
    model = model_lib.Transformer(resolved.model)
  model = platform_choices.model_for_mesh(model, mesh)  # model.kernels='auto': the mesh's platform
  tx = optimizer_lib.make_optimizer(t)
  schedule = optimizer_lib.learning_rate_schedule(t)
  abstract, shardings = train_state_lib.state_shardings(model, tx, mesh, resolved.data.seq_len)
  step_fn = train_step_lib.make_train_step(
      model, tx, schedule, mesh, shardings, grad_accum_steps=t.grad_accum_steps,
      pad_id=resolved.model.pad_id, loss_chunk_tokens=t.loss_chunk_tokens)
  return Setup(config=resolved, mesh=mesh, model=model, tx=tx, schedule=schedule,
               abstract=abstract, shardings=shardings, step_fn=step_fn)
