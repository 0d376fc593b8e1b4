"""Evaluation: perplexity against length (`perplexity`), restoring runs from training workdirs
(`runs`), the plot (`plot`), the arithmetic task's accuracy by length (`arithmetic_accuracy`)
and its depth x operators experiment (`arithmetic_sweep`).

Import the submodules directly; this package imports nothing heavy on its own.
"""
