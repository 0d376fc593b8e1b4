"""bipe_jax: Bilevel Positional Encoding (BiPE), DAPE and baselines in JAX/Flax.

Importing the package loads nothing: import what you use. The model and the encodings
(`bipe_jax.positions`, `bipe_jax.encodings`, `bipe_jax.attention`, `bipe_jax.model`) need only
the core dependencies (jax, flax, numpy, ml_collections); training (`bipe_jax.training`), data
(`bipe_jax.data`: grain, TFDS, SentencePiece) and evaluation need the extras of pyproject.toml.
Generated datasets (`data.dataset='arithmetic'`, ...) register themselves on first use
(bipe_jax/data/generated.py).
"""

__version__ = '0.1.0'  # equal to pyproject.toml's version (tests/test_release.py)
