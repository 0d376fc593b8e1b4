"""bipe_jax: Bilevel Positional Encoding (BiPE), DAPE and baselines in JAX/Flax."""

from bipe_jax import tasks as _tasks  # registers the generated datasets (arithmetic)
