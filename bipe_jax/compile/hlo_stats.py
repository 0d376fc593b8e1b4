"""Figures read from compiled programs: collectives in HLO text, JAX primitives in a jaxpr, the
bytes one device holds of a sharded tree, the size an out-of-memory message names."""

import collections
import math
import re

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

COLLECTIVE_KINDS = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all',
                    'collective-permute')


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


_SIZE = re.compile(r'([\d.]+)\s*([KMGT])i?B?\b')
_UNITS = {'K': 1024, 'M': 1024 ** 2, 'G': 1024 ** 3, 'T': 1024 ** 4}


def required_bytes(message: str) -> int:
  """The first size ('68.78G', '3.1M') in the TPU compiler's out-of-memory message, in bytes."""
  match = _SIZE.search(message)
  return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else 0


_UNCOSTED = re.compile(r'custom_call_target="ConcatBitcast"')


def optimal_seconds(cost: dict, hlo_text: str) -> float:
  """XLA's TPU cost model's `optimal_seconds` of a compiled program, 0 when it has none.

  The model costs each `ConcatBitcast` custom call the TPU compiler inserts (large arrays, e.g.
  a [D, V] embedding, reassembled from slices) at -1 s, a sentinel, not a time: a program with n
  of them reports its time minus n (seen: vocabulary 4096 -> -4.99985 with 5 of them, 1024 ->
  +6e-5 with none). They are counted as free (data movement): a negative value is read as its
  fraction above the next lower whole second, n = -floor(value) sentinels costed, which the
  program text must hold (else the time is unknown: 0). The text can hold more than are costed
  (DAPE-Kerple's blockwise costing programs, unrolled: adding back every one gave 339 s a
  layer at the paper preset), so n is not read from it. This reading assumes the program runs
  in under a second, as the costing programs do (1 and 2 layers: 56 and 74 ms at the paper
  preset).
  """
  raw = float(cost.get('optimal_seconds', 0.0))
  if raw < 0:
    costed = -math.floor(raw)
    if costed > len(_UNCOSTED.findall(hlo_text)):
      return 0.0
    raw += costed
  return raw if raw > 0 else 0.0


_WHILE = re.compile(r'=\s*\S.*?\swhile\(')


def count_while_loops(hlo_text: str) -> int:
  """How many while instructions a compiled HLO module's text holds."""
  return sum(1 for line in hlo_text.splitlines() if _WHILE.search(line))
