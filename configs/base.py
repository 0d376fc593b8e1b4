"""Shared defaults for every preset: `bipe_jax.defaults` (inside the package, so library code
and installed users read the same defaults); presets override fields of `get_base_config()`."""

from bipe_jax.defaults import checkpoint_defaults
from bipe_jax.defaults import data_defaults
from bipe_jax.defaults import get_base_config
from bipe_jax.defaults import mesh_defaults
from bipe_jax.defaults import model_defaults
from bipe_jax.defaults import train_defaults

__all__ = ['checkpoint_defaults', 'data_defaults', 'get_base_config', 'mesh_defaults',
           'model_defaults', 'train_defaults']
