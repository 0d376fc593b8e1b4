"""The train state, created under `jax.eval_shape` and materialised directly sharded.

`create_train_state` never builds an unsharded copy of the parameters: it traces the model's
init abstractly to read the logical partitioning of every parameter, turns that into
NamedShardings on the mesh (mesh.py), derives the optimizer state's shardings from the
parameters' (`optax.tree_map_params`), then runs the init under
`jax.jit(out_shardings=...)` so each device only ever holds its own shard.
"""

import contextlib
from typing import Any, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bipe_jax.state import mesh as mesh_lib


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the data iterator.

  step: int32 [] number of updates done. params: float32 parameter tree (the master copy).
  opt_state: optax state. rng: uint32 [2] base key (per-step keys are fold_in(rng, step)).
  """
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


@contextlib.contextmanager
def mesh_context(mesh: jax.sharding.Mesh, rules=mesh_lib.LOGICAL_AXIS_RULES):
  """Makes `mesh` the current mesh and `rules` the logical-axis rules (for tracing)."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def _init_fn(model: nn.Module, tx: optax.GradientTransformation, seq_len: int):
  def init(rng_2):
    params_rng, state_rng = jax.random.split(rng_2)
    variables = model.init(params_rng, jnp.zeros((1, seq_len), jnp.int32))
    params = nn.unbox(variables['params'])
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=state_rng)
  return init


def param_shardings(model: nn.Module, mesh: jax.sharding.Mesh, seq_len: int) -> tuple[Any, Any]:
  """(abstract_params, shardings) of the model's parameters alone: no optimizer is built (what
  evaluation, generation and conversion restore)."""
  rng = jax.random.PRNGKey(0)  # made outside the mesh (a TPU topology's devices run nothing)
  with mesh_context(mesh):
    abstract_vars = jax.eval_shape(
        lambda r: model.init(r, jnp.zeros((1, seq_len), jnp.int32)), rng)
  logical_specs = nn.get_partition_spec(abstract_vars)['params']
  abstract_params = nn.unbox(abstract_vars['params'])
  return abstract_params, mesh_lib.logical_to_shardings(logical_specs, abstract_params, mesh)


def state_shardings(model: nn.Module, tx: optax.GradientTransformation,
                    mesh: jax.sharding.Mesh, seq_len: int) -> tuple[TrainState, TrainState]:
  """(abstract_state, shardings): shapes/dtypes of the state and its NamedShardings (the
  state _init_fn makes; the model's init is traced once, the optimizer's init from its
  parameters' shapes)."""
  abstract_params, param_sh = param_shardings(model, mesh, seq_len)
  rng = jax.random.PRNGKey(0)
  with mesh_context(mesh):
    abstract_state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
                                opt_state=jax.eval_shape(tx.init, abstract_params),
                                rng=jax.eval_shape(lambda r: jax.random.split(r)[1], rng))
  repl = mesh_lib.replicated(mesh)
  opt_sh = optax.tree_map_params(
      tx, lambda _, sharding: sharding, abstract_state.opt_state, param_sh,
      transform_non_params=lambda _: repl,
      is_leaf=lambda x: isinstance(x, jax.sharding.NamedSharding))
  shardings = TrainState(step=repl, params=param_sh, opt_state=opt_sh, rng=repl)
  return abstract_state, shardings


def create_train_state(model: nn.Module, tx: optax.GradientTransformation,
                       mesh: jax.sharding.Mesh, seq_len: int, seed: int,
                       shardings: Optional[TrainState] = None):
  """(state, shardings): a freshly initialised state laid out on `mesh`. `shardings`: those
  state_shardings gives for the same arguments, when the caller has them already (else
  computed: two more traces of the model's init)."""
  if shardings is None:
    _, shardings = state_shardings(model, tx, mesh, seq_len)
  with mesh_context(mesh):
    init = jax.jit(_init_fn(model, tx, seq_len), out_shardings=shardings)
    state = init(jax.random.PRNGKey(seed))
  return state, shardings


def abstract_with_shardings(abstract_state: TrainState, shardings: TrainState) -> TrainState:
  """ShapeDtypeStructs carrying the target shardings (restore onto this mesh)."""
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings)
