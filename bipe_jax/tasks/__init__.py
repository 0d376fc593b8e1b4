"""Synthetic tasks: the arithmetic chain-of-thought task of the BiPE paper (`arithmetic`), built
on expressions mod a prime generated as Feng et al. 2023 do (`modular_expressions`)."""
