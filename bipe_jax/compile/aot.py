"""Compile the real training step for a TPU topology ahead of time, on any host (no TPU needed).

    report = compile_for_topology(config, 'v5e:2x4')
    print(report_lib.format_report(report))  # compile/report.py

With the `libtpu` wheel installed (requirements-tpu.txt), `jax.experimental.topologies` describes
the devices of a TPU slice (`v5e:2x4`, `v4:2x2x1`, `v5p:2x2x1`, ...) without any TPU attached.
The config's mesh is laid over those devices, and the run's set-up is built as training builds
it (`training/setup.build`: the train state abstractly, `jax.eval_shape`, nothing allocated);
its step -- the one `trainer.py` runs -- is lowered with
`jax.ShapeDtypeStruct` arguments and compiled by the TPU compiler. The compiled program gives
exact per-chip figures: argument / output / temporary bytes (`memory_analysis`), FLOPs
(`cost_analysis`, per chip: the partitioned program) and the collectives of its HLO text.
With `eval_lengths`, the evaluation forward (summed next-token NLL of a [B, L] batch, the
computation of evaluation/perplexity.py) is compiled too, at each length.
"""

import dataclasses
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp

from bipe_jax.compile import gpu_lowering
from bipe_jax.compile import gpu_targets
from bipe_jax.compile import hlo_stats
from bipe_jax.compile import topologies
from bipe_jax.compile.report import CompileReport
from bipe_jax.compile.report import StepFigures
from bipe_jax.compile.topologies import CompileError
from bipe_jax.compile.topologies import hbm_bytes
from bipe_jax.compile.topologies import stderr_to_file
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.training import flops as flops_lib
from bipe_jax.training import init_from
from bipe_jax.training import resolve as resolve_lib
from bipe_jax.training import setup as setup_lib
from bipe_jax.training import train_step

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
      collectives=hlo_stats.count_collectives(text), compile_seconds=seconds,
      optimal_seconds=hlo_stats.optimal_seconds(cost, text),
      while_loops=hlo_stats.count_while_loops(text))


def _compile(fn, args, name: str, model_flops: float, keep_text: bool = False,
             lowering_platform: Optional[str] = None,
             compiler_options: Optional[dict] = None) -> StepFigures:
  start = time.perf_counter()
  if lowering_platform:
    try:
      lowered = fn.trace(*args).lower(lowering_platforms=(lowering_platform,))
    except Exception as e:  # pylint: disable=broad-except (JAX reports its own types)
      raise CompileError(f'the {name} step did not lower for {lowering_platform}: '
                         f'{" ".join(str(e).split())[:400]}') from None
    return StepFigures(name, 0, 0, 0, 0, 0, 0.0, model_flops, {}, time.perf_counter() - start,
                       lowered_summary=gpu_lowering.summarize(lowered.as_text()))
  with stderr_to_file() as output:
    try:
      lowered = fn.lower(*args)
      compiled = lowered.compile(compiler_options=compiler_options or None)
    except Exception as e:  # pylint: disable=broad-except (XLA reports its own types)
      detail = ' '.join(str(e).split())
      if 'RESOURCE_EXHAUSTED' in detail and 'memory' in detail.lower():
        message = detail[detail.index('RESOURCE_EXHAUSTED'):][:300]
        return StepFigures(name, 0, 0, 0, 0, 0, 0.0, model_flops, {},
                           time.perf_counter() - start,
                           out_of_memory=message, required_bytes=hlo_stats.required_bytes(
                               message.split(':', 1)[-1]))
      logged = output().strip().splitlines()
      raise CompileError(f'the {name} step did not compile: {detail[:400]}'
                         + (f' ({logged[-1][:200]})' if logged else '')) from None
  figures = _figures(name, compiled, time.perf_counter() - start, model_flops)
  if keep_text:
    figures.text = {'lowered': lowered.as_text(), 'compiled': compiled.as_text(),
                    'primitives': ','.join(f'{k}={v}' for k, v in sorted(
                        hlo_stats.primitive_counts(fn.trace(*args).jaxpr).items()))}
  return figures


def compile_for_topology(config, topology: str, *, num_slices: int = 1,
                         eval_lengths: Sequence[int] = (), eval_batch_size: int = 0,
                         devices: Optional[list] = None, keep_text: bool = False,
                         platform: str = 'tpu',
                         lowering_platform: Optional[str] = None,
                         compiler_options: Optional[dict] = None) -> CompileReport:
  """Compiles `config`'s training step (and eval forward at `eval_lengths`) for `topology`.

  `platform`: 'tpu' (topology 'v5e:2x4', ...) or 'cuda' (a GPU topology 'h100:8', 'h200:2x8':
  compile/gpu_targets.py; needs the CUDA PJRT plugin, make setup-cuda).
  `lowering_platform` ('cuda'): lower for that platform over `devices` (the host's) instead of
  compiling; the steps then carry `lowered_summary` and no byte figures (gpu_lowering.py).
  `compiler_options`: XLA / libtpu options for the compiler, e.g. {'xla_msa_enable': False}:
  no values placed in the TPU's on-chip VMEM by memory-space assignment, so the temporaries
  are everything the program keeps (docs/accelerators.md, "Reading per-chip temporaries").

  `config`: an ml_collections config as `train/main.py` takes (configs/base.py sections),
  resolved by `resolve` over the topology's devices (not edited). `devices` overrides the topology (any
  devices: tests pass CPU ones). Raises CompileError or run_config.ConfigError (one line).
  """

  if devices is None:
    devices = topologies.platform_devices(platform, topology, num_slices)
  resolved = resolve(config, len(devices))
  # model.kernels='auto' resolves by the mesh's devices: the portable path for a TPU topology
  try:
    mesh = _mesh(resolved.mesh, devices, num_slices)
  except AssertionError as e:  # jax's mesh_utils asserts on device layouts it cannot tile
    raise CompileError(f'--topology={topology}: no device mesh can be laid over its '
                       f'{len(devices)} devices ({" ".join(str(e).split())}); name the slice '
                       'as its chips in 3-D, e.g. v4:2x2x1, v5p:2x2x1') from None
  setup = setup_lib.build(resolved, mesh)
  return compile_setup(setup, topology, num_slices=num_slices, eval_lengths=eval_lengths,
                       eval_batch_size=eval_batch_size, keep_text=keep_text,
                       lowering_platform=lowering_platform, compiler_options=compiler_options)


def resolve(config, device_count: int):
  """The RunConfig a compile builds (training/resolve.py): what training resolves from the data
  (separator ids, an inter-stream RoPE original length), which the compiled program depends on
  only as constants, filled with placeholders. ConfigError (one line)."""
  early = resolve_lib.resolve(config, device_count=device_count, placeholders=True)
  return resolve_lib.resolve(config, device_count=device_count, placeholders=True,
                             init_source_seq_len=init_from.source_seq_len(early.train.init_from))


def compile_setup(setup: setup_lib.Setup, topology: str, *, num_slices: int = 1,
                  eval_lengths: Sequence[int] = (), eval_batch_size: int = 0,
                  keep_text: bool = False,
                  lowering_platform: Optional[str] = None,
                  compiler_options: Optional[dict] = None) -> CompileReport:
  """Compiles (or with `lowering_platform`, lowers) the step of `setup` (training/setup.py, on
  the mesh of the devices to compile for) and the evaluation forward at `eval_lengths`;
  `topology` names them in the report."""
  config, mesh, t = setup.config, setup.mesh, setup.config.train  # a RunConfig
  devices = list(mesh.devices.flat)
  state_args = setup.target()
  tokens = jax.ShapeDtypeStruct((t.batch_size, setup.seq_len), jnp.int32,
                                sharding=mesh_lib.batch_sharding(mesh))
  steps = []
  with setup.context():
    train_flops = (flops_lib.train_flops_per_token(setup.model.config, setup.seq_len)
                   * t.batch_size * setup.seq_len / len(devices))
    steps.append(_compile(setup.step_fn, (state_args, {'tokens': tokens}), 'train',
                          train_flops, keep_text, lowering_platform, compiler_options))
    for length in eval_lengths:
      steps.append(_compile_eval(setup.model, mesh, state_args.params, length,
                                 eval_batch_size or t.batch_size, config.model.pad_id,
                                 lowering_platform))
  device = devices[0]
  if device.platform in ('gpu', 'cuda'):
    # XLA's GPU cost analysis leaves out the library and kernel calls (cuBLAS gemms, cuDNN,
    # Triton) that do most of the work: on a real H100 the 151M step reported 0.0057 of the
    # model's 7.24 TFLOPs. The report shows '-' rather than that.
    steps = [dataclasses.replace(step, flops=0.0) for step in steps]
  abstract, shardings = setup.abstract, setup.shardings
  return CompileReport(
      topology=topology, num_slices=num_slices, device_kind=device.device_kind,
      num_devices=len(devices), mesh=dict(mesh.shape), hbm_bytes=hbm_bytes(device.device_kind),
      param_bytes=hlo_stats.shard_bytes(abstract.params, shardings.params),
      optimizer_bytes=hlo_stats.shard_bytes(abstract.opt_state, shardings.opt_state),
      steps=steps, config_summary=_summary(config, setup.model))


def lower_for_cuda(config, topology: str, *, eval_lengths: Sequence[int] = (),
                   eval_batch_size: int = 0) -> CompileReport:
  """Lowers one device's share (gpu_lowering.one_device_share) of `config`'s training step (and
  evaluation forwards) for CUDA on this host's first CPU device, where XLA's GPU compiler is not
  available; the steps carry `lowered_summary`. Raises CompileError / ConfigError (one line)."""
  try:
    gpus = gpu_targets.parse_topology(topology)
  except gpu_targets.GpuTopologyError as e:
    raise CompileError(str(e)) from None
  share = gpu_lowering.one_device_share(config, gpus.num_devices)
  return compile_for_topology(
      share, topology, eval_lengths=eval_lengths,
      eval_batch_size=max(1, eval_batch_size // gpus.num_devices) if eval_batch_size else 0,
      devices=jax.devices('cpu')[:1], platform='cuda', lowering_platform='cuda')


def _mesh(mesh_config, devices: list, num_slices: int):
  """The config's mesh over `devices`; over several slices the data axis spans them (the
  slow links between slices carry only the data-parallel gradient reduction)."""
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
                  pad_id: int, lowering_platform: Optional[str] = None) -> StepFigures:
  """The evaluation forward at `length`: summed next-token NLL and count of a [B, L] batch."""
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
  return _compile(fn, (param_args, tokens), f'eval@{int(length)}', model_flops,
                  lowering_platform=lowering_platform)


def _summary(config, model=None) -> dict:
  """The settings that decide memory; attention_impl as `model` (resolved for the mesh:
  platform_choices.py) runs it."""
  m, t = config.model, config.train
  chosen = getattr(model, 'config', m)
  return {
      'position_encoding': m.position_encoding, 'num_layers': int(m.num_layers),
      'hidden_size': int(m.hidden_size), 'dtype': m.dtype, 'remat': m.remat,
      'scan_layers': bool(m.scan_layers),
      'attention_impl': getattr(chosen, 'attention_impl', m.attention_impl),
      'kernels': m.kernels,
      'block_size': int(getattr(chosen, 'block_size', m.block_size)),
      'batch_size': int(t.batch_size), 'seq_len': int(config.data.seq_len),
      'grad_accum_steps': int(t.grad_accum_steps),
      'loss_chunk_tokens': int(t.loss_chunk_tokens),
  }
