"""One set-up for a training run: the model, optimizer, schedule, abstract state, shardings and
the jitted step, built once from a config and a mesh.

    setup = build(config, mesh)            # or build(config, mesh, model_config=...)
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
import ml_collections
import optax

from bipe_jax import config as model_config_lib
from bipe_jax import platform_choices
from bipe_jax import model as model_lib
from bipe_jax.state import optimizer as optimizer_lib
from bipe_jax.state import train_state as train_state_lib
from bipe_jax.training import train_step as train_step_lib


@dataclasses.dataclass(frozen=True)
class Setup:
  """What one training run is made of. `model` has its kernels resolved for `mesh`."""
  config: ml_collections.ConfigDict  # as validated and resolved; not modified here
  mesh: jax.sharding.Mesh
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract: train_state_lib.TrainState  # shapes / dtypes (jax.ShapeDtypeStruct leaves)
  shardings: train_state_lib.TrainState  # NamedSharding leaves
  step_fn: Callable  # (state, {'tokens': [B, T]}) -> (state, scalars), jitted, state donated

  @property
  def seq_len(self) -> int:
    return int(self.config.data.seq_len)

  def target(self) -> train_state_lib.TrainState:
    """The abstract state with its shardings: what a checkpoint restores onto."""
    return train_state_lib.abstract_with_shardings(self.abstract, self.shardings)

  def fresh_state(self, seed: int) -> tuple[train_state_lib.TrainState, Any]:
    """(state, shardings): a freshly initialised train state, laid out on the mesh."""
    return train_state_lib.create_train_state(self.model, self.tx, self.mesh, self.seq_len, seed)

  def context(self):
    """The mesh and logical-axis rules to trace and run the step under."""
    return train_state_lib.mesh_context(self.mesh)


def build(config, mesh: jax.sharding.Mesh, *,
          model_config: Optional[model_config_lib.ModelConfig] = None,
          model: Optional[nn.Module] = None) -> Setup:
  """The set-up of `config` (validated: config_validation) on `mesh`.

  model_config: the resolved ModelConfig (separators from the tokenizer); default built from
  config.model. model: any linen module tokens [B, T] -> logits [B, T, V] instead of the
  project's Transformer.
  """
  t = config.train
  if model is None:
    model = model_lib.Transformer(model_config or
                                  model_config_lib.model_config_from_dict(config.model))
  model = platform_choices.model_for_mesh(model, mesh)  # model.kernels='auto': the mesh's platform
  tx = optimizer_lib.make_optimizer(t)
  schedule = optimizer_lib.learning_rate_schedule(t)
  abstract, shardings = train_state_lib.state_shardings(model, tx, mesh, int(config.data.seq_len))
  step_fn = train_step_lib.make_train_step(
      model, tx, schedule, mesh, shardings, grad_accum_steps=t.grad_accum_steps,
      pad_id=int(config.model.pad_id), loss_chunk_tokens=t.loss_chunk_tokens)
  return Setup(config=config, mesh=mesh, model=model, tx=tx, schedule=schedule,
               abstract=abstract, shardings=shardings, step_fn=step_fn)
