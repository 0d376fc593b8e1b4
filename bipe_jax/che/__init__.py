"""Length generalisation on the Chomsky-hierarchy tasks (Ruoss et al. 2023; DAPE's CHE
experiments): an encoder Transformer of this project (`model.causal=False`) reads the input
followed by one placeholder token per output and predicts the outputs at the placeholders; it is
trained with the uniform length curriculum 1..40 and scored at every length (or a documented
subset) up to 500.

  segments.py   BiPE's segments on the tasks (none | task | fixed:K) -> position streams
  batches.py    task batches -> padded model inputs (one padded shape per bucket of lengths)
  model.py      the benchmark's model (5 layers x width 64) as a ModelConfig, either block
                (--architecture: 'project' | 'peer'); logits at outputs
  peer.py       the benchmark's own block: post-LayerNorm, ReLU MLP, dropout 0.1, biases
  training.py   the train loop (uniform curriculum, Adam; batches padded to buckets of 32 tokens)
  scoring.py    per-length accuracy with bucketed padding; the score (mean over 41..500)
  cell.py       train + score one (task, encoding, seed) and write its JSON / plot
  sweep.py      a grid of cells, resumable; the table
"""
