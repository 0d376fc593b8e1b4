"""Synthetic tasks: the arithmetic chain-of-thought task of the BiPE paper (`arithmetic`), built
on expressions mod a prime generated as Feng et al. 2023 do (`modular_expressions`), and
synthetic passkey retrieval (`passkey`).

Importing this package registers each task's dataset with `bipe_jax.data.generated`
(`data.dataset='arithmetic'`, `data.dataset='passkey'`).
"""

from bipe_jax.tasks import arithmetic  # registers data.dataset='arithmetic'
from bipe_jax.tasks import passkey  # registers data.dataset='passkey'
from bipe_jax.tasks import scrolls  # registers data.dataset='scrolls'
