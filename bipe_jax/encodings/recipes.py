"""Recipes of current models, each one config field (model.*):

  rope_fraction   partial rotary / p-RoPE (Barbero et al. 2024): rotate only the fraction p of
                  the rotary pairs with the HIGHEST frequencies; the lowest ones get frequency
                  0 (cos 1, sin 0: those dimensions pass unrotated). 1 = full RoPE, 0 = NoPE.
  nope_every      NoPE layers interleaved: every k-th layer (layers k-1, 2k-1, ...) runs
                  attention without the scheme's rotary / bias / transform (input embeddings
                  still apply); 0 = off.
  query_log_scale log-length query scaling past the training length: q *= max(1, log(pos + 1) /
                  log(train_length)) on the token stream, for any scheme (rope.rope_log_scale
                  with min_scale 1: positions inside the training length are unchanged).
"""

import numpy as np


def partial_rotary_frequencies(inv_freq: np.ndarray, fraction: float) -> np.ndarray:
  """inv_freq [Dh/2] (highest frequency first, as rope.rope_inv_frequencies) with all but the
  first round(fraction * Dh/2) set to 0."""
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f'model.rope_fraction={fraction!r} is invalid: must be in [0, 1].')
  kept = int(round(fraction * inv_freq.shape[0]))
  return np.where(np.arange(inv_freq.shape[0]) < kept, inv_freq, 0.0).astype(inv_freq.dtype)


def is_nope_layer(layer: int, every: int) -> bool:
  """True for the layers `nope_every` makes position-free: the k-th, 2k-th, ... (1-based)."""
  return every > 0 and (layer + 1) % every == 0
