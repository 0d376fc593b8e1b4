"""Evaluation: perplexity against length (`perplexity`), restoring runs from training workdirs
(`runs`), the plot (`plot`) and the arithmetic task's accuracy by length (`arithmetic_accuracy`).

Import the submodules directly; this package imports nothing heavy on its own.
"""
