"""A run's workdir: config.json and the resume check
(run_record), the single-writer lock (workdir_lock), the tokenizer it pins (tokenizer), its log
file (run_logging), its segment statistics (position_stats), and a trained run restored from it
(restore: evaluation, generation, init_from, convert).

Above state/, below training/: imports nothing from training/, compile/ or evaluation/
(tests/project/test_import_structure.py).
"""
