"""The 15 tasks of the Chomsky-hierarchy benchmark (Deletang et al. 2023, "Neural networks and
the Chomsky hierarchy"; the length-generalisation setup of Ruoss et al. 2023, which DAPE uses),
as seeded generators of any length: `get_task(name).sample(np.random.default_rng(seed), B, L)`.

Levels: regular (regular.py), deterministic context-free (dcf.py), context-sensitive (cs.py).
Vocabularies, output lengths and the outputs that count for accuracy follow the benchmark (see
each module's docstring and base.py).
"""

from bipe_jax.tasks.che import cs
from bipe_jax.tasks.che import dcf
from bipe_jax.tasks.che import regular
from bipe_jax.tasks.che.base import Batch
from bipe_jax.tasks.che.base import Task

TASKS = {t.name: t for t in (*regular.TASKS, *dcf.TASKS, *cs.TASKS)}
TASK_NAMES = tuple(TASKS)


def get_task(name: str) -> Task:
  if name not in TASKS:
    raise ValueError(f'unknown CHE task {name!r}; valid names are: {", ".join(TASK_NAMES)}.')
  return TASKS[name]
