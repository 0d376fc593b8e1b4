"""Training: the train step, the loop and what sets a run up.

Entry points: `trainer.train(config, workdir)` and `cli.run(...)` (what train/main.py calls).
Modules: setup (the one set-up of a run: model, optimizer, schedule, abstract state, shardings,
step), distributed (multi-host start-up), train_step (loss and jitted step), chunked_loss,
data_loading (logical data shards), flops (FLOPs/token, MFU), progress (progress line,
TensorBoard), validation, resolve (a config resolved into a bipe_jax.run_config.RunConfig;
one-line ConfigError), init_from (parameters from another run or a Hugging Face folder),
train_loop, trainer (the loop).
The mesh, optimizer, train state and checkpoints live in bipe_jax.state; a run's workdir files
in bipe_jax.runs.
"""
