"""The train state and what it lives on: the named mesh and sharding rules (mesh), AdamW and its
schedules (optimizer), the sharded train state (train_state), Orbax checkpoints (checkpointing).

Below runs/ and training/: imports nothing from them (tests/project/test_import_structure.py).
"""
