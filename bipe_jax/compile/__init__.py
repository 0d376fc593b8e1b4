"""Ahead-of-time compilation for a TPU slice on any host: the topologies and their HBM
(topologies), HLO statistics (hlo_stats), the per-chip report (report), the compile of the
training and evaluation steps (aot) and what train/compile.py runs (cli).

The top layer: imports training/, nothing imports it (tests/project/test_import_structure.py).
"""
