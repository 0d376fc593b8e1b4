"""bipe_jax: Bilevel Positional Encoding (BiPE), DAPE and baselines in JAX/Flax.

Importing the package loads nothing: import what you use. The model and the encodings
(`bipe_jax.positions`, `bipe_jax.encodings`, `bipe_jax.attention`, `bipe_jax.model`) need only
the core dependencies (jax, flax, numpy, ml_collections); training (`bipe_jax.training`), data
(`bipe_jax.data`: grain, TFDS, SentencePiece) and evaluation need the extras of pyproject.toml.
Generated datasets (`data.dataset='arithmetic'`, ...) register themselves on first use
(bipe_jax/data/generated.py).

On a host without a TPU or GPU, importing the package makes JAX use its CPU platform unless
JAX_PLATFORMS is set (bipe_jax.platforms): with the `libtpu` wheel installed JAX would
otherwise probe for a TPU and print libtpu's errors. A TPU or GPU host is left alone.
"""

from bipe_jax import platforms as _platforms

_platforms.use_cpu_without_accelerator()

__version__ = '0.2.0'  # equal to pyproject.toml's version (tests/project/test_release.py)
