"""Pallas attention kernels that compute positional biases per tile: bias_attention.py (TPU,
Mosaic) and gpu_attention.py (CUDA GPUs, Triton); both run in interpret mode on CPU."""

from bipe_jax.attention.pallas.bias_attention import pallas_attention
from bipe_jax.attention.pallas.gpu_attention import pallas_gpu_attention
from bipe_jax.attention.pallas.tile_bias import KINDS, TileBias

__all__ = ['KINDS', 'TileBias', 'pallas_attention', 'pallas_gpu_attention']
