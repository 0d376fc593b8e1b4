"""`ConfigError`: a config value that cannot work, in one line naming the field, its value and
what is allowed (defined beside the typed sections in bipe_jax/run_config.py, which raise it).

Checking and resolving a config is `bipe_jax.training.resolve.resolve` (pure: it returns a
RunConfig, the config is never edited); the sections check their own fields when constructed.
"""

from bipe_jax.run_config import ConfigError

__all__ = ['ConfigError']
