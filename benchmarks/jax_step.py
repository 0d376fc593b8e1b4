"""Builds the project's own training step (bipe_jax.training) for benchmarking.

`make_project_step(preset, overrides)` returns a `ProjectStep`: a closure running one real
training step -- `bipe_jax.training.train_step.make_train_step` (jit, donated state,
AdamW with clipping, float32 next-token loss) on a one-device mesh -- on a fixed random
batch, plus the facts a benchmark needs (tokens per step, FLOPs per token from the
code's own formula in `bipe_jax.training.flops`, parameter count).

Presets are the config files in configs/ ('tiny', ...) plus two defined here: 'small', a
CPU-sized step up from tiny (width 256, 6 layers, 8 heads, FFN 1024, batch 16 x 256), and
'smoke', the smallest step that still runs every part (1 layer, width 32, vocab 256, batch
2 x 32: the benchmarks' smoke runs, tests/project/test_benchmarks_smoke.py).
No tokenizer is needed: `model.separators` is set to 'ids' with `SEPARATOR_IDS`, and
tokens are uniform random ids (position streams cost the same whatever the ids).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Any, Callable, Mapping

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SEPARATOR_IDS = (13, 29)  # any two ids: with uniform random tokens ~1 segment break / 2k tokens

SMALL_OVERRIDES = {
    'model.hidden_size': 256, 'model.num_layers': 6, 'model.num_heads': 8,
    'model.ffn_size': 1024, 'model.max_intra': 256, 'model.max_position': 256,
    'model.rope_original_length': 256, 'model.block_size': 128,
    'data.seq_len': 256, 'train.batch_size': 16,
}

SMOKE_OVERRIDES = {
    'model.hidden_size': 32, 'model.num_layers': 1, 'model.num_heads': 2,
    'model.ffn_size': 64, 'model.vocab_size': 256, 'model.max_intra': 32,
    'model.max_position': 32, 'model.block_size': 16, 'data.seq_len': 32,
    'train.batch_size': 2, 'train.loss_chunk_tokens': 0,
}
BUILT_IN = {'small': SMALL_OVERRIDES, 'smoke': SMOKE_OVERRIDES}  # on top of configs/tiny.py


def load_config(preset: str, overrides: Mapping[str, Any] | None = None):
  """configs/<preset>.py's get_config() (or 'small' / 'smoke'), with dotted `overrides`
  applied."""
  if preset in BUILT_IN:
    config = importlib.import_module('configs.tiny').get_config()
    overrides = {**BUILT_IN[preset], **(overrides or {})}
  else:
    try:
      config = importlib.import_module(f'configs.{preset}').get_config()
    except ModuleNotFoundError as e:
      raise ValueError(f"unknown preset {preset!r}: use 'small', 'smoke' or a file name in "
                       "configs/ (e.g. 'tiny', 'rope_151m')") from e
  config.model.separators = 'ids'
  config.model.separator_ids = SEPARATOR_IDS
  for key, value in (overrides or {}).items():
    section, _, field = key.partition('.')
    if section not in config or field not in config[section]:
      raise ValueError(f'unknown config field {key!r} (override must be section.field)')
    config[section][field] = value
  return config


@dataclasses.dataclass
class ProjectStep:
  step: Callable[[], Any]  # runs one training step; returns (state, metrics)
  tokens_per_step: int
  train_flops_per_token: float
  num_params: int
  config: Any
  loss: Callable[[], float]  # loss of the latest step
  hlo_text: Callable[[], str]  # the compiled step's optimised HLO (for profile_step.py)


def make_project_step(preset: str = 'tiny', overrides: Mapping[str, Any] | None = None,
                      *, seed: int = 0, devices: int = 1) -> ProjectStep:
  """The project's jitted training step for `preset` + `overrides`, data-parallel over the
  first `devices` JAX devices (on a CPU host: see `use_cpu_devices`); the first step runs here
  (compilation)."""
  s = _make_project_step(preset, overrides, seed=seed, devices=devices)
  s.step()
  return s


def use_cpu_devices(count: int) -> int:
  """Splits this CPU host into `count` single-threaded JAX devices and keeps freed host memory
  in the process, as `train/main.py --cpu_devices` does with the cpu kernels
  (bipe_jax.kernels.process_setup); call before JAX starts. The malloc settings are
  process-wide, so a PyTorch step timed in the same process gets them too."""
  from bipe_jax.kernels import process_setup  # pylint: disable=g-import-not-at-top
  process_setup.setup_process('cpu', count)  # as train/main.py: for both sides of a comparison
  return count


def _make_project_step(preset, overrides, *, seed, devices=1):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bipe_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import flops as flops_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import optimizer as opt_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import train_state as state_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import train_step as step_lib  # pylint: disable=g-import-not-at-top

  config = load_config(preset, overrides)
  mc = config_lib.model_config_from_dict(config.model)
  model = model_lib.Transformer(mc)
  tx = opt_lib.make_optimizer(config.train)
  schedule = opt_lib.learning_rate_schedule(config.train)
  if not 1 <= devices <= len(jax.devices()):
    raise ValueError(f'devices={devices}: this host has {len(jax.devices())} JAX devices '
                     '(on CPU: use_cpu_devices(n) before JAX starts)')
  config.mesh.data = devices
  mesh = mesh_lib.make_mesh(config.mesh, devices=jax.devices()[:devices])
  seq_len, batch = int(config.data.seq_len), int(config.train.batch_size)
  state, shardings = state_lib.create_train_state(model, tx, mesh, seq_len, seed)
  with state_lib.mesh_context(mesh):
    jitted = step_lib.make_train_step(model, tx, schedule, mesh, shardings, pad_id=mc.pad_id,
                                      loss_chunk_tokens=config.train.loss_chunk_tokens)
  tokens = jax.random.randint(jax.random.PRNGKey(seed + 1), (batch, seq_len), 0,
                              mc.vocab_size, dtype=jnp.int32)
  data = {'tokens': jax.device_put(tokens, mesh_lib.batch_sharding(mesh))}
  holder = {'state': state, 'metrics': None}

  def step():
    with state_lib.mesh_context(mesh):
      holder['state'], holder['metrics'] = jitted(holder['state'], data)
    return holder['state'], holder['metrics']

  def hlo_text():
    with state_lib.mesh_context(mesh):
      return jitted.lower(holder['state'], data).compile().as_text()

  n_params = sum(int(x.size) for x in jax.tree.leaves(state.params))
  return ProjectStep(
      step=step, tokens_per_step=batch * seq_len,
      train_flops_per_token=flops_lib.train_flops_per_token(mc, seq_len),
      num_params=n_params, config=config,
      loss=lambda: float(holder['metrics']['loss']), hlo_text=hlo_text)
