"""Synthetic tasks: the arithmetic chain-of-thought task of the BiPE paper (`arithmetic`), built
on expressions mod a prime generated as Feng et al. 2023 do (`modular_expressions`).

Importing this package registers each task's dataset with `bipe_jax.data.generated`
(`data.dataset='arithmetic'`).
"""

from bipe_jax.tasks import arithmetic  # registers data.dataset='arithmetic'
