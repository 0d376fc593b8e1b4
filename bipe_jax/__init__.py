"""bipe_jax: Bilevel Positional Encoding (BiPE), DAPE and baselines in JAX/Flax."""
