"""Checks of the public functions' inputs: one clear error naming the expected layout.

Shape checks run when a function is traced (shapes are static), so they cost nothing inside
`jax.jit`. Value checks (token ids in range) need the values: they run only on concrete arrays
(eager calls, `generate()`, the CLIs) and are skipped on tracers, because a check inside a
compiled program would need `jax.experimental.checkify` (a functionalised error value threaded
through the program, and a host round trip to raise it) on every step. Under jit an
out-of-range token id is not checked: every `Transformer` logit of its row is NaN (Flax's
embedding lookup fills out-of-range rows with NaN, and attention carries the NaN to every query
of the row) and `bilevel_positions` treats it as no separator (tests/encodings/test_input_checks.py).
"""

from __future__ import annotations

import jax
import numpy as np


def is_concrete(x) -> bool:
  """True for NumPy values and jax.Arrays that are not being traced."""
  return not isinstance(x, jax.core.Tracer)


def check_token_ids(tokens, vocab_size: int, what: str = 'token ids', valid=None) -> None:
  """ValueError when a concrete `tokens` holds an id outside [0, vocab_size); a tracer passes.

  `valid` (bool, tokens' shape, optional): only the ids where it is True are checked (padding
  may hold any id)."""
  if not is_concrete(tokens) or (valid is not None and not is_concrete(valid)):
    return
  ids = np.asarray(tokens)
  if valid is not None:
    ids = ids[np.broadcast_to(np.asarray(valid, bool), ids.shape)]
  if ids.size == 0:
    return
  low, high = int(ids.min()), int(ids.max())
  if low < 0 or high >= vocab_size:
    bad = sorted({int(i) for i in ids[(ids < 0) | (ids >= vocab_size)].ravel()[:1000]})
    raise ValueError(f'{what}: ids {bad[:8]}{" ..." if len(bad) > 8 else ""} are out of range '
                     f'for vocab_size {vocab_size} (allowed 0..{vocab_size - 1})')


def check_positions(function: str, **positions) -> None:
  """Each named array must be 2-D [B, N] (B may be 1 and broadcast); their B must agree."""
  batches = set()
  for name, value in positions.items():
    shape = np.shape(value)
    if len(shape) != 2:
      raise ValueError(f'{function}: {name} must be [B, {name[0].upper()}] (2-D positions), '
                       f'got shape {shape}')
    batches.add(shape[0])
  if len(batches - {1}) > 1:
    raise ValueError(f'{function}: the batch sizes of '
                     f'{", ".join(f"{n} {np.shape(v)}" for n, v in positions.items())} differ '
                     '(each must be B or 1)')


def check_per_head(function: str, **per_head) -> None:
  """Each named array must be 1-D [H], all of the same H."""
  sizes = set()
  for name, value in per_head.items():
    shape = np.shape(value)
    if len(shape) != 1:
      raise ValueError(f'{function}: {name} must be [H] (one value per head), got shape {shape}')
    sizes.add(shape[0])
  if len(sizes) > 1:
    raise ValueError(f'{function}: {", ".join(f"{n} {np.shape(v)}" for n, v in per_head.items())}'
                     ' must have the same number of heads')


def check_heads_layout(function: str, x, positions) -> None:
  """x must be [B, H, T, Dh] and positions [B or 1, T] with x's T on axis 2.

  A [B, T, H, Dh] tensor is caught when its H differs from T (axis 2 then disagrees with the
  positions); when H == T the two layouts have the same shape and cannot be told apart."""
  check_positions(function, positions_BxT=positions)
  shape, (pb, pt) = np.shape(x), np.shape(positions)
  if len(shape) != 4:
    raise ValueError(f'{function}: x must be [B, H, T, Dh], got shape {shape}')
  if pt != shape[2]:
    hint = ('; x looks like [B, T, H, Dh]: transpose it to [B, H, T, Dh] '
            '(x.transpose(0, 2, 1, 3))' if pt == shape[1] else '')
    raise ValueError(f'{function}: x must be [B, H, T, Dh] with T = positions.shape[1] = {pt}, '
                     f'got x {shape}{hint}')
  if pb not in (1, shape[0]):
    raise ValueError(f'{function}: positions batch {pb} must be 1 or x\'s batch {shape[0]}')
