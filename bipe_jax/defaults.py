"""The config's defaults, section by section: every preset (configs/*.py) starts from
`get_base_config()` and overrides fields of it.

Each section is the ConfigDict of its dataclass's field defaults, the one place they are
defined and documented: the model's in `bipe_jax.config.ModelConfig`, the others in
`bipe_jax.run_config` (DataConfig, TrainConfig, CheckpointConfig, MeshConfig).
"""

import ml_collections

from bipe_jax import config as model_config_lib
from bipe_jax import run_config


def model_defaults() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(model_config_lib.default_fields())


def data_defaults() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(run_config.default_fields(run_config.DataConfig))


def train_defaults() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(run_config.default_fields(run_config.TrainConfig))


def checkpoint_defaults() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(run_config.default_fields(run_config.CheckpointConfig))


def mesh_defaults() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(run_config.default_fields(run_config.MeshConfig))


def get_base_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = model_defaults()
  config.data = data_defaults()
  config.train = train_defaults()
  config.checkpoint = checkpoint_defaults()
  config.mesh = mesh_defaults()
  return config
