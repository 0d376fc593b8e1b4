"""What a program lowered for CUDA shows, on a host that cannot compile it for a GPU.

JAX lowers a jitted function for another platform without its compiler
(`jit(f).trace(...).lower(lowering_platforms=('cuda',))`, also on a CPU-only jaxlib): the
StableHLO text says which operations the program is made of before XLA's GPU passes, which
custom calls it makes (cuDNN's fused attention, a Pallas Triton kernel) and which collectives it
holds. `summarize` reads that text; `one_device_share` is the config of one device's share of a
run, which compile/aot.lower_for_cuda lowers: the fallback of `train/compile.py --platform=cuda`
where the CUDA plugin is missing.
"""

import collections
import re

# StableHLO operations worth counting in a training step (name in the text -> label).
_OPS = {
    'stablehlo.dot_general': 'dot_general',
    'stablehlo.while': 'while (scans, blockwise loops)',
    'stablehlo.all_gather': 'all-gather',
    'stablehlo.reduce_scatter': 'reduce-scatter',
    'stablehlo.all_reduce': 'all-reduce',
    'stablehlo.all_to_all': 'all-to-all',
    'stablehlo.collective_permute': 'collective-permute',
    'stablehlo.custom_call': 'custom_call',
}
_CUSTOM_CALL = re.compile(r'stablehlo\.custom_call\s*@([\w$.\-]+)')
_OP = re.compile(r'\b(stablehlo\.[a-z_]+)\b')
# Custom-call targets whose kernels are attention (substring -> what ran).
_ATTENTION_CALLS = (
    ('cudnn', 'cuDNN fused attention'),
    ('triton', 'Pallas Triton kernel'),
    ('mosaic_gpu', 'Pallas Mosaic GPU kernel'),
)


def summarize(stablehlo_text: str) -> dict:
  """{'ops': {label: count}, 'custom_calls': {target: count}, 'attention': what ran}."""
  ops = collections.Counter()
  for name in _OP.findall(stablehlo_text):
    if name in _OPS:
      ops[_OPS[name]] += 1
  calls = collections.Counter(_CUSTOM_CALL.findall(stablehlo_text))
  attention = [label for key, label in _ATTENTION_CALLS
               if any(key in target.lower() for target in calls)]
  return {'ops': dict(ops), 'custom_calls': dict(calls),
          'attention': ', '.join(attention) or 'XLA (dense or blockwise attention from '
                                               'dot_general + softmax; no attention kernel)'}


def format_summary(name: str, summary: dict) -> str:
  """Lines of one lowered step's summary for the terminal."""
  lines = [f'{name}: lowered for CUDA (not compiled); attention: {summary["attention"]}']
  for label, count in sorted(summary['ops'].items()):
    lines.append(f'  {label:<34}{count:>8}')
  for target, count in sorted(summary['custom_calls'].items()):
    lines.append(f'  custom_call @{target:<21}{count:>8}')
  return '\n'.join(lines)


def one_device_share(config, num_devices: int):
  """A copy of `config` for ONE device's share of a run on `num_devices` GPUs: a 1-device mesh,
  the per-device batch (train.batch_size // num_devices, at least 1), the portable kernels (the
  forms GPUs compile; the CPU path is a host-only choice). Collectives are then absent: one
  device's program has none; the compiled report of a GPU topology shows them."""
  share = config.copy_and_resolve_references()
  with share.unlocked():
    for axis in ('data', 'fsdp', 'context', 'tensor'):
      if axis in share.mesh:
        share.mesh[axis] = 1
    share.train.batch_size = max(1, int(config.train.batch_size) // max(1, num_devices))
    share.model.kernels = 'portable'
  return share

