"""Training: named mesh + sharding, optimizer, train state, Orbax checkpoints, the loop.

Entry points: `trainer.train(config, workdir)` and `cli.run(...)` (what train/main.py calls).
Modules: mesh (device mesh, logical-axis rules, global batches), distributed (multi-host
start-up), optimizer (AdamW + schedules), train_state (sharded init), train_step (loss and
jitted step), checkpointing (Orbax manager, data-iterator state, fallback), data_loading
(logical data shards), flops (FLOPs/token, MFU), progress (progress line, TensorBoard),
config_validation (one-line config errors), trainer (the loop).
"""
