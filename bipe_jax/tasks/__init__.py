"""Synthetic tasks: the arithmetic chain-of-thought task of the BiPE paper (`arithmetic`)."""
