"""Evaluation: perplexity against length (`perplexity`), the plot (`plot`), the arithmetic task's
accuracy by length (`arithmetic_accuracy`) and its depth x operators experiment
(`arithmetic_sweep`). Runs are restored from their training workdirs by bipe_jax/runs/restore.py
and scored by bipe_jax/block_scoring.py, both shared with training.

Import the submodules directly; this package imports nothing heavy on its own.
"""
