"""Pallas attention kernels that compute positional biases per tile (see bias_attention.py)."""

from bipe_jax.attention.pallas.bias_attention import pallas_attention
from bipe_jax.attention.pallas.tile_bias import KINDS, TileBias

__all__ = ['KINDS', 'TileBias', 'pallas_attention']
