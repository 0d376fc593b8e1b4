"""configs/paper_151m.py (the paper's 151M models on the Pile) with the settings of a TPU v5e-8,
taken from compiling the step for that slice (train/compile.py --topology=v5e:2x4,
docs/accelerators.md, docs/tpu.md):

  --config=configs/paper_151m_tpu.py:ENCODING[_llama]     (the same presets as paper_151m.py)

- bfloat16 compute, float32 parameters and optimizer state (`model.dtype='bfloat16'`: the
  master weights, Adam moments and gradient reduction stay float32).
- `model.remat='save_projections'`: at 256 x 1024 (32 rows per chip) the bfloat16 step compiles
  to 12.79 of 16 GiB per v5e chip saving the projections' outputs, and needs about 25 GiB
  without remat (refused); full remat fits with more room but recomputes every layer's matmuls.
- loss in chunks of 4096 positions per batch shard (`train.loss_chunk_tokens`): one chunk's
  float32 logits are 4096 x 32000 x 4 B = 0.5 GiB, 8 chunks per step on a chip's 32 x 1024.
- `data.num_threads=32`: the pipeline tokenised about 250k tokens/s with 2 threads on the
  project's 2-core CPU (core-bound there); train/compile.py predicts that a v5e-8 consumes
  about 366k tokens/s (45.7k per chip: an estimate of XLA's TPU cost model, docs/accelerators.md),
  and its host has 224 vCPUs (v5litepod-8; 112 per host on the 4-chip hosts of larger slices), so
  32 threads leave a wide margin; `data.prefetch=4`.
- `model.block_size=512`: the Pallas kernel's tiles (paper_151m.py's 256 is blockwise
  attention's block on other hardware). One layer by XLA's TPU cost model at this shape
  (benchmarks/tpu_layer_cost.py --block_sizes, benchmarks/results/tpu_layer_cost_rope_blocks.md):
  bipe_rope 19.45 / 17.99 / 17.15 / 18.00 ms at tiles of 128 / 256 / 512 / 1024, bipe_alibi
  18.14 / 16.69 / 15.95 / 16.65 ms; 512 also has a quarter of 256's grid steps, whose overhead
  the model does not price. The fused DAPE kernel keeps 128 (its VMEM: attention/op.py).
Everything else, and what it reproduces of the paper, is paper_151m.py's (see its docstring).
"""

from configs import paper_151m


def get_config(preset: str = 'bipe_rope'):
  config = paper_151m.get_config(preset)
  config.model.dtype = 'bfloat16'
  config.model.remat = 'save_projections'
  config.train.loss_chunk_tokens = 4096
  config.data.num_threads = 32
  config.data.prefetch = 4
  config.model.block_size = 512
  return config
