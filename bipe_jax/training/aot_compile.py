"""Compile the real training step for a TPU topology ahead of time, on any host (no TPU needed).

    report = compile_for_topology(config, 'v5e:2x4')
    print(format_report(report))

With the `libtpu` wheel installed (requirements-tpu.txt), `jax.experimental.topologies` describes
the devices of a TPU slice (`v5e:2x4`, `v4:2x2x1`, `v5p:2x2x1`, ...) without any TPU attached.
The config's mesh is laid over those devices, the train state is built abstractly
(`train_state.state_shardings`: `jax.eval_shape`, nothing allocated) and the step of
`train_step.make_train_step` -- the one `trainer.py` runs -- is lowered with
`jax.ShapeDtypeStruct` arguments and compiled by the TPU compiler. The compiled program gives
exact per-chip figures: argument / output / temporary bytes (`memory_analysis`), FLOPs
(`cost_analysis`, per chip: the partitioned program) and the collectives of its HLO text.
With `eval_lengths`, the evaluation forward (summed next-token NLL of a [B, L] batch, the
computation of evaluation/perplexity.py) is compiled too, at each length.
"""

import collections
import contextlib
import dataclasses
import os
import re
import tempfile
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

GIB = 1024 ** 3

# HBM per JAX TPU device, by device_kind (first substring match wins, most specific first).
# v4 and v5p: one device per chip (megacore, both TensorCores). Sources: Cloud TPU system
# architecture pages of each generation.
HBM_BYTES_BY_KIND = (
    ('v6 lite', 32 * GIB),  # Trillium / v6e
    ('v5 lite', 16 * GIB),  # v5e
    ('v5p', 95 * GIB),
    ('v5', 95 * GIB),  # v5p reports device_kind 'TPU v5'
    ('v4', 32 * GIB),
    ('v3', 16 * GIB),  # per device (one TensorCore); 32 GiB per chip
    ('v2', 8 * GIB),
)

COLLECTIVE_KINDS = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all',
                    'collective-permute')


class CompileError(ValueError):
  """A topology or config this module cannot compile; the message is one line."""


@dataclasses.dataclass
class StepFigures:
  """Per-chip figures of one compiled program (bytes, FLOPs, collectives)."""
  name: str  # 'train' or 'eval@<length>'
  argument_bytes: int
  output_bytes: int
  alias_bytes: int  # outputs written in place of donated arguments
  temp_bytes: int
  generated_code_bytes: int
  flops: float  # XLA's count for one chip's program; a loop's body (scanned layers, attention
  # blocks, loss chunks) is counted once, not once per iteration
  model_flops: float  # per chip per step: training 6N-style model FLOPs (training/flops.py) / chips
  collectives: dict  # kind -> {'ops': distinct collectives, 'arrays': arrays they move}
  compile_seconds: float
  # The TPU compiler refuses a program that exceeds HBM (RESOURCE_EXHAUSTED): then the figures
  # above are 0, `out_of_memory` holds its message and `required_bytes` the size it names.
  out_of_memory: str = ''
  required_bytes: int = 0
  # XLA's TPU cost model: the program's predicted seconds (`cost_analysis()['optimal_seconds']`,
  # loops counted once like `flops`; 0 where the backend gives none), and how many while loops
  # the compiled program still holds (training/step_cost.py costs a loop-free version).
  optimal_seconds: float = 0.0
  while_loops: int = 0
  # With compile_for_topology(keep_text=True): {'lowered': StableHLO before XLA's passes,
  # 'compiled': the optimised HLO, 'primitives': 'name=count,...' of the traced step's JAX
  # primitives}; left out of the JSON.
  text: dict = dataclasses.field(default_factory=dict, repr=False)

  @property
  def total_bytes(self) -> int:
    """Peak HBM of the program: arguments + outputs not aliased to them + temporaries + code
    (for a refused program, the size the compiler's message names)."""
    if self.out_of_memory:
      return self.required_bytes
    return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.generated_code_bytes)


@dataclasses.dataclass
class CompileReport:
  topology: str
  num_slices: int
  device_kind: str
  num_devices: int
  mesh: dict  # axis -> size
  hbm_bytes: int  # per chip (0 = unknown generation)
  param_bytes: int  # per chip: this chip's shards of the parameters
  optimizer_bytes: int  # per chip: its shards of the optimizer state
  steps: list  # StepFigures, the training step first
  config_summary: dict  # the settings that decide memory (dtype, remat, batch, ...)

  def fits(self, step: Optional[StepFigures] = None) -> bool:
    step = step or self.steps[0]
    if step.out_of_memory:
      return False
    return not self.hbm_bytes or step.total_bytes <= self.hbm_bytes

  def to_json(self) -> dict:
    out = dataclasses.asdict(self)
    for entry, step in zip(out['steps'], self.steps):
      del entry['text']
      entry['total_bytes'] = step.total_bytes
      entry['fits'] = self.fits(step)
    out['fits'] = all(self.fits(s) for s in self.steps)
    return out


def hbm_bytes(device_kind: str) -> int:
  """HBM of one device of `device_kind` (e.g. 'TPU v5 lite'), 0 when unknown."""
  kind = device_kind.lower()
  for name, size in HBM_BYTES_BY_KIND:
    if name in kind:
      return size
  return 0


@contextlib.contextmanager
def _stderr_to_file():
  """Sends file descriptor 2 to a temporary file for the block; yields a reader of it.

  libtpu writes its initialisation warnings (no TPU attached, no worker hostnames) from C++
  straight to fd 2 while it describes a topology; Python's sys.stderr cannot hold them back.
  """
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode='w+b') as capture:
    os.dup2(capture.fileno(), 2)
    try:
      yield lambda: (capture.seek(0), capture.read().decode(errors='replace'))[1]
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def topology_devices(name: str, num_slices: int = 1) -> list:
  """The TPU devices of topology `name` ('v5e:2x4', 'v4:2x2x1', ...) over `num_slices` slices.

  Raises CompileError (one line) when libtpu is missing or does not know the name.
  """
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  # libtpu takes a host-wide lock file (/tmp/libtpu_lockfile) for the TPU chips it would own;
  # compiling owns no chip, so several compiles (or users) on one host must not exclude each
  # other. Read when libtpu loads, i.e. at the first topology request of the process.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  kwargs = {'num_slices': num_slices} if num_slices > 1 else {}
  with _stderr_to_file() as libtpu_output:
    try:
      topology = topologies.get_topology_desc(platform='tpu', topology_name=name, **kwargs)
    except Exception as e:  # pylint: disable=broad-except (jaxlib raises its own types)
      detail = ' '.join(str(e).split())[:300]
      if 'Unknown backend' in detail or 'tpu' in detail.lower() and 'plugin' in detail.lower():
        raise CompileError(f'--topology={name}: the TPU compiler is not installed (pip install '
                           f'-r requirements-tpu.txt); {detail}') from None
      raise CompileError(f'--topology={name} (num_slices={num_slices}) is not a TPU topology '
                         f'libtpu knows (e.g. v5e:2x4, v4:2x2x1, v5p:2x2x1): {detail}') from None
    del libtpu_output
  return list(topology.devices)


def shard_bytes(abstract_tree, sharding_tree) -> int:
  """Bytes one device holds of a tree of arrays laid out by `sharding_tree` (the largest shard
  of each leaf: the per-device figure for any device when dimensions divide evenly)."""
  total = 0
  for leaf, sharding in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(
      sharding_tree, is_leaf=lambda x: isinstance(x, NamedSharding))):
    shape = sharding.shard_shape(leaf.shape)
    total += int(jnp.dtype(leaf.dtype).itemsize) * int(_prod(shape))
  return total


def _prod(shape) -> int:
  out = 1
  for s in shape:
    out *= int(s)
  return out


_COLLECTIVE = re.compile(r'=\s*(\S.*?)\s(' + '|'.join(COLLECTIVE_KINDS) + r')(?:-start)?\((.*)$')
_COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s')
_ARRAY = re.compile(r'\b(?:pred|[suf]\d+|bf16|f8\w*|c64|c128)\[')


def count_collectives(hlo_text: str) -> dict:
  """{kind: {'ops': n, 'arrays': m}} of a compiled HLO module's text.

  One collective is counted once however the TPU compiler printed it: an asynchronous
  collective split into several `async_collective_fusion` pieces keeps its `channel_id`, so
  collectives are told apart by channel id (the instruction text would count each piece). An
  all-reduce inside an `all-reduce-scatter` fusion is how XLA TPU writes a reduce-scatter, and
  counts as one per fusion. Combined collectives move several arrays in one op: `arrays` counts them
  (a tuple result of 12 gradients is 1 op, 12 arrays).
  """
  seen = collections.defaultdict(dict)
  computation = ''
  for number, line in enumerate(hlo_text.splitlines()):
    if line and not line[0].isspace():
      match = _COMPUTATION.match(line)
      computation = match.group(1) if match else computation
      continue
    match = _COLLECTIVE.search(line)
    if not match:
      continue
    result, kind, rest = match.groups()
    channel = re.search(r'channel_id=(\d+)', rest)
    key = channel.group(1) if channel else f'line {number}'
    if kind == 'all-reduce' and computation.startswith('all-reduce-scatter'):
      # each such fusion is one reduce-scatter; the compiler numbers their channels afresh
      # (two fusions both print channel_id=1), so the fusion's name tells them apart
      kind, key = 'reduce-scatter', computation
    seen[kind][key] = max(seen[kind].get(key, 0), len(_ARRAY.findall(result)) or 1)
  return {kind: {'ops': len(seen[kind]), 'arrays': sum(seen[kind].values())}
          for kind in COLLECTIVE_KINDS if seen.get(kind)}


_UNCOSTED = re.compile(r'custom_call_target="ConcatBitcast"')


def optimal_seconds(cost: dict, hlo_text: str) -> float:
  """XLA's TPU cost model's `optimal_seconds` of a compiled program, 0 when it has none.

  The model costs each `ConcatBitcast` custom call the TPU compiler inserts (large arrays, e.g.
  a [D, V] embedding, reassembled from slices) at -1 s, a sentinel, not a time: a program with n
  of them reports its time minus n (seen: vocabulary 4096 -> -4.99985 with 5 of them, 1024 ->
  +6e-5 with none). They are counted as free (data movement) and the n seconds added back; a
  value still negative is unknown (0).
  """
  raw = float(cost.get('optimal_seconds', 0.0))
  if raw < 0:
    raw += len(_UNCOSTED.findall(hlo_text))
  return raw if raw > 0 else 0.0


_WHILE = re.compile(r'=\s*\S.*?\swhile\(')


def count_while_loops(hlo_text: str) -> int:
  """How many while instructions a compiled HLO module's text holds."""
  return sum(1 for line in hlo_text.splitlines() if _WHILE.search(line))


def primitive_counts(jaxpr) -> collections.Counter:
  """How many equations of each primitive a (closed) jaxpr holds, nested jaxprs included."""
  jaxpr = getattr(jaxpr, 'jaxpr', jaxpr)
  counts = collections.Counter()
  for eqn in jaxpr.eqns:
    counts[eqn.primitive.name] += 1
    for value in eqn.params.values():
      for item in value if isinstance(value, (tuple, list)) else (value,):
        if hasattr(item, 'eqns') or hasattr(getattr(item, 'jaxpr', None), 'eqns'):
          counts += primitive_counts(item)
  return counts


def _figures(name: str, compiled, seconds: float, model_flops: float) -> StepFigures:
  memory = compiled.memory_analysis()
  text = compiled.as_text()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
  return StepFigures(
      name=name, argument_bytes=int(memory.argument_size_in_bytes),
      output_bytes=int(memory.output_size_in_bytes), alias_bytes=int(memory.alias_size_in_bytes),
      temp_bytes=int(memory.temp_size_in_bytes),
      generated_code_bytes=int(memory.generated_code_size_in_bytes),
      flops=float(cost.get('flops', 0.0)), model_flops=model_flops,
      collectives=count_collectives(text), compile_seconds=seconds,
      optimal_seconds=optimal_seconds(cost, text), while_loops=count_while_loops(text))


def _placeholder_separators(config) -> None:
  """Fills what training resolves from the data, which the compiled program does not depend on
  beyond constants: separator ids (a lookup table's values) and an inter-stream RoPE original
  length (a scale)."""
  from bipe_jax.training import position_stats  # pylint: disable=g-import-not-at-top
  m = config.model
  with config.unlocked() if hasattr(config, 'unlocked') else contextlib.nullcontext():
    if not tuple(m.get('separator_ids', ())):
      m.separators = 'ids'
      m.separator_ids = (min(13, int(m.vocab_size) - 1),)
    if position_stats.needs_inter_original_length(m):
      m.rope_original_length = max(1, int(config.data.seq_len) // 16)


_SIZE = re.compile(r'([\d.]+)\s*([KMGT])i?B?\b')
_UNITS = {'K': 1024, 'M': 1024 ** 2, 'G': 1024 ** 3, 'T': 1024 ** 4}


def required_bytes(message: str) -> int:
  """The first size ('68.78G', '3.1M') in the TPU compiler's out-of-memory message, in bytes."""
  match = _SIZE.search(message)
  return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else 0


def _compile(fn, args, name: str, model_flops: float, keep_text: bool = False) -> StepFigures:
  start = time.perf_counter()
  with _stderr_to_file() as output:
    try:
      lowered = fn.lower(*args)
      compiled = lowered.compile()
    except Exception as e:  # pylint: disable=broad-except (XLA reports its own types)
      detail = ' '.join(str(e).split())
      if 'RESOURCE_EXHAUSTED' in detail and 'memory' in detail.lower():
        message = detail[detail.index('RESOURCE_EXHAUSTED'):][:300]
        return StepFigures(name, 0, 0, 0, 0, 0, 0.0, model_flops, {},
                           time.perf_counter() - start,
                           out_of_memory=message, required_bytes=required_bytes(
                               message.split(':', 1)[-1]))
      logged = output().strip().splitlines()
      raise CompileError(f'the {name} step did not compile: {detail[:400]}'
                         + (f' ({logged[-1][:200]})' if logged else '')) from None
  figures = _figures(name, compiled, time.perf_counter() - start, model_flops)
  if keep_text:
    figures.text = {'lowered': lowered.as_text(), 'compiled': compiled.as_text(),
                    'primitives': ','.join(f'{k}={v}' for k, v in sorted(
                        primitive_counts(fn.trace(*args).jaxpr).items()))}
  return figures


def compile_for_topology(config, topology: str, *, num_slices: int = 1,
                         eval_lengths: Sequence[int] = (), eval_batch_size: int = 0,
                         devices: Optional[list] = None, keep_text: bool = False) -> CompileReport:
  """Compiles `config`'s training step (and eval forward at `eval_lengths`) for `topology`.

  `config`: an ml_collections config as `train/main.py` takes (configs/base.py sections); the
  mesh section is resolved over the topology's devices. `devices` overrides the topology (any
  devices: tests pass CPU ones). Raises CompileError or config_validation.ConfigError (one line).
  """
  # Imported here: a caller that only formats reports does not pay for the model's imports.
  from bipe_jax import config as model_config_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax import kernels  # pylint: disable=g-import-not-at-top
  from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import config_validation  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import flops as flops_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import train_state  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import train_step  # pylint: disable=g-import-not-at-top

  if devices is None:
    devices = topology_devices(topology, num_slices)
  config = config.copy_and_resolve_references()
  _placeholder_separators(config)
  config_validation.derive_fields(config)
  config_validation.validate_config(config, len(devices))
  try:
    model_config = model_config_lib.model_config_from_dict(config.model)
  except ValueError as e:
    raise config_validation.ConfigError(str(e)) from None
  t = config.train
  seq_len = int(config.data.seq_len)
  tx = optimizer_lib.make_optimizer(t)
  schedule = optimizer_lib.learning_rate_schedule(t)
  mesh = _mesh(config.mesh, devices, num_slices)
  # model.kernels='auto' resolves by the mesh's devices: the portable path for a TPU topology
  model = model_lib.Transformer(kernels.config_for_mesh(model_config, mesh))
  abstract, shardings = train_state.state_shardings(model, tx, mesh, seq_len)
  state_args = train_state.abstract_with_shardings(abstract, shardings)
  tokens = jax.ShapeDtypeStruct((t.batch_size, seq_len), jnp.int32,
                                sharding=mesh_lib.batch_sharding(mesh))
  steps = []
  with train_state.mesh_context(mesh):
    step = train_step.make_train_step(
        model, tx, schedule, mesh, shardings, grad_accum_steps=t.grad_accum_steps,
        pad_id=int(config.model.pad_id), loss_chunk_tokens=t.loss_chunk_tokens)
    train_flops = (flops_lib.train_flops_per_token(model_config, seq_len) * t.batch_size
                   * seq_len / len(devices))
    steps.append(_compile(step, (state_args, {'tokens': tokens}), 'train', train_flops,
                          keep_text))
    for length in eval_lengths:
      steps.append(_compile_eval(model, mesh, state_args.params, length,
                                 eval_batch_size or t.batch_size, int(config.model.pad_id)))
  device = devices[0]
  return CompileReport(
      topology=topology, num_slices=num_slices, device_kind=device.device_kind,
      num_devices=len(devices), mesh=dict(mesh.shape), hbm_bytes=hbm_bytes(device.device_kind),
      param_bytes=shard_bytes(abstract.params, shardings.params),
      optimizer_bytes=shard_bytes(abstract.opt_state, shardings.opt_state),
      steps=steps, config_summary=_summary(config))


def _mesh(mesh_config, devices: list, num_slices: int):
  """The config's mesh over `devices`; over several slices the data axis spans them (the
  slow links between slices carry only the data-parallel gradient reduction)."""
  from bipe_jax.training import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  if num_slices == 1:
    return mesh_lib.make_mesh(mesh_config, devices)
  from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
  shape = mesh_lib.resolve_mesh_shape(mesh_lib.mesh_sizes(mesh_config), len(devices))
  if shape[0] % num_slices:
    raise CompileError(f'--num_slices={num_slices}: the data axis spans the slices, so '
                       f'mesh.data ({shape[0]}) must be a multiple of it')
  grid = mesh_utils.create_hybrid_device_mesh(
      (shape[0] // num_slices,) + shape[1:], (num_slices,) + (1,) * (len(shape) - 1), devices)
  auto = (jax.sharding.AxisType.Auto,) * len(mesh_lib.MESH_AXES)
  return jax.sharding.Mesh(grid, mesh_lib.MESH_AXES, axis_types=auto)


def _compile_eval(model, mesh, param_args, length: int, batch_size: int,
                  pad_id: int) -> StepFigures:
  """The evaluation forward at `length`: summed next-token NLL and count of a [B, L] batch."""
  from bipe_jax.training import flops as flops_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import train_step  # pylint: disable=g-import-not-at-top
  shards = mesh_lib.batch_shards(mesh)
  batch_size = -(-batch_size // shards) * shards
  model_flops = (flops_lib.forward_flops_per_token(model.config, int(length)) * batch_size
                 * int(length) / mesh.devices.size)

  def evaluate(params, tokens_BxL):
    return train_step.next_token_nll(model.apply({'params': params}, tokens_BxL), tokens_BxL,
                                     pad_id)

  fn = jax.jit(evaluate, in_shardings=(jax.tree.map(lambda a: a.sharding, param_args),
                                       mesh_lib.batch_sharding(mesh)),
               out_shardings=mesh_lib.replicated(mesh))
  tokens = jax.ShapeDtypeStruct((batch_size, int(length)), jnp.int32)
  return _compile(fn, (param_args, tokens), f'eval@{int(length)}', model_flops)


def _summary(config) -> dict:
  m, t = config.model, config.train
  return {
      'position_encoding': m.position_encoding, 'num_layers': int(m.num_layers),
      'hidden_size': int(m.hidden_size), 'dtype': m.dtype, 'remat': m.remat,
      'scan_layers': bool(m.scan_layers), 'attention_impl': m.attention_impl,
      'kernels': m.kernels,
      'batch_size': int(t.batch_size), 'seq_len': int(config.data.seq_len),
      'grad_accum_steps': int(t.grad_accum_steps),
      'loss_chunk_tokens': int(t.loss_chunk_tokens),
  }


def fit_advice(report: CompileReport) -> str:
  """One line: why a step does not fit and which settings would help."""
  step = next((st for st in report.steps if not report.fits(st)), report.steps[0])
  s, mesh = report.config_summary, report.mesh
  state = report.param_bytes + report.optimizer_bytes
  helps = []
  if state > report.hbm_bytes // 2:
    if mesh['fsdp'] < report.num_devices:
      helps.append(f'shard parameters and optimizer state (mesh.fsdp={report.num_devices}, '
                   f'mesh.data=1)')
    helps.append('a larger slice')
  if s['remat'] in (False, 'none'):
    helps.append("recompute activations (model.remat='full' or 'save_projections')")
  if s['batch_size'] // max(1, mesh['data'] * mesh['fsdp']) > 1:
    helps.append(f'a smaller per-chip batch (train.batch_size < {s["batch_size"]}, or '
                 f'train.grad_accum_steps > {s["grad_accum_steps"]})')
  if s['dtype'] == 'float32':
    helps.append("bfloat16 compute (model.dtype='bfloat16')")
  return (f'does not fit: the {step.name} step needs {step.total_bytes / GIB:.2f} GiB per chip '
          f'of {report.hbm_bytes / GIB:.0f} GiB HBM ({report.device_kind}, {report.topology}; '
          f'parameters + optimizer state {state / GIB:.2f} GiB); try '
          + '; '.join(helps))


def format_report(report: CompileReport) -> str:
  """The per-chip table: memory by kind against HBM, FLOPs, collectives, compile time."""
  gib = lambda b: f'{b / GIB:8.3f} GiB'  # pylint: disable=unnecessary-lambda-assignment
  mesh = ' x '.join(f'{k}={v}' for k, v in report.mesh.items())
  s = report.config_summary
  lines = [
      f'{report.topology} ({report.num_slices} slice{"s" if report.num_slices > 1 else ""}): '
      f'{report.num_devices} x {report.device_kind}, '
      f'{report.hbm_bytes / GIB:.0f} GiB HBM per chip; mesh {mesh}',
      f'{s["position_encoding"]}, {s["num_layers"]} layers x {s["hidden_size"]}, '
      f'batch {s["batch_size"]} x {s["seq_len"]}, dtype {s["dtype"]}, remat {s["remat"]}, '
      f'scan_layers {s["scan_layers"]}',
      '',
      f'per chip                      {"".join(f"{st.name:>16}" for st in report.steps)}',
  ]

  def row(label, values):
    lines.append(f'{label:<30}' + ''.join(f'{v:>16}' for v in values))

  row('parameters', [gib(report.param_bytes)] + [''] * (len(report.steps) - 1))
  row('optimizer state', [gib(report.optimizer_bytes)] + [''] * (len(report.steps) - 1))
  known = lambda st, b: '-' if st.out_of_memory else gib(b)  # pylint: disable=unnecessary-lambda-assignment
  row('arguments', [known(st, st.argument_bytes) for st in report.steps])
  row('outputs (not aliased)', [known(st, st.output_bytes - st.alias_bytes)
                                for st in report.steps])
  row('temporaries', [known(st, st.temp_bytes) for st in report.steps])
  row('program code', [known(st, st.generated_code_bytes) for st in report.steps])
  row('total', [gib(st.total_bytes) for st in report.steps])
  row('HBM', [gib(report.hbm_bytes)] * len(report.steps))
  row('fits', ['yes' if report.fits(st) else 'NO' for st in report.steps])
  row('model TFLOPs per step', [f'{st.model_flops / 1e12:.4g}' for st in report.steps])
  row('XLA TFLOPs (loops once)', ['-' if st.out_of_memory else f'{st.flops / 1e12:.4g}'
                                   for st in report.steps])
  for kind in COLLECTIVE_KINDS:
    row(f'{kind} (ops / arrays)', [
        '-' if st.out_of_memory else f'{st.collectives.get(kind, {}).get("ops", 0)} / '
        f'{st.collectives.get(kind, {}).get("arrays", 0)}' for st in report.steps])
  row('compile time', [f'{st.compile_seconds:.1f} s' for st in report.steps])
  for st in report.steps:
    if st.out_of_memory:
      lines.append(f'{st.name}: the TPU compiler refused the program: {st.out_of_memory}')
  return '\n'.join(lines)
