"""The per-chip report of an ahead-of-time compile: figures per step, whether they fit HBM, the
printed table and a one-line advice when they do not."""

import dataclasses
from typing import Optional

from bipe_jax.compile.hlo_stats import COLLECTIVE_KINDS
from bipe_jax.compile.topologies import GIB

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
  # the compiled program still holds (compile/step_cost.py costs a loop-free version).
  optimal_seconds: float = 0.0
  while_loops: int = 0
  # With compile_for_topology(keep_text=True): {'lowered': StableHLO before XLA's passes,
  # 'compiled': the optimised HLO, 'primitives': 'name=count,...' of the traced step's JAX
  # primitives}; left out of the JSON.
  text: dict = dataclasses.field(default_factory=dict, repr=False)
  # Lowered but not compiled (compile_for_topology(lowering_platform='cuda') on a host without
  # the platform's compiler): the lowered program's summary (gpu_lowering.summarize); the
  # byte figures above are then 0.
  lowered_summary: dict = dataclasses.field(default_factory=dict)

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


def fit_advice(report: CompileReport) -> str:
  """One line: why a step does not fit and which settings would help."""
  step = next((st for st in report.steps if not report.fits(st)), report.steps[0])
  s, mesh = report.config_summary, report.mesh
  if 'vmem' in (step.out_of_memory or '').lower():  # a kernel's on-chip scratch, not HBM
    return (f'does not compile: a kernel of the {step.name} step needs more VMEM (the '
            f'on-chip scratch memory of {report.device_kind}) than its scoped limit; try '
            f'smaller attention tiles (model.block_size < {s["block_size"]}) or '
            "another attention path (model.attention_impl='blockwise')")
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
      f'scan_layers {s["scan_layers"]}, attention {s["attention_impl"]}',
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
  # '-': refused, or no cost analysis (XLA's GPU one leaves out the library calls: aot.py)
  row('XLA TFLOPs (loops once)', ['-' if st.out_of_memory or not st.flops
                                   else f'{st.flops / 1e12:.4g}' for st in report.steps])
  for kind in COLLECTIVE_KINDS:
    row(f'{kind} (ops / arrays)', [
        '-' if st.out_of_memory else f'{st.collectives.get(kind, {}).get("ops", 0)} / '
        f'{st.collectives.get(kind, {}).get("arrays", 0)}' for st in report.steps])
  row('compile time', [f'{st.compile_seconds:.1f} s' for st in report.steps])
  for st in report.steps:
    if st.out_of_memory:
      lines.append(f'{st.name}: the TPU compiler refused the program: {st.out_of_memory}')
  if any(not st.out_of_memory and st.temp_bytes < GIB / 2000 for st in report.steps):
    lines.append('temporaries below 0.0005 GiB show as 0.000: the compiler needs (almost) no '
                 'scratch memory beyond the arguments and outputs for a program this small')
  return '\n'.join(lines)
