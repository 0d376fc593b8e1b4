"""DAPE-Kerple as in the DAPE paper: a 125M-class model, train length 512, Adam(0.9, 0.95).

With the untied 50304-token embeddings (77M of the total) bipe_jax.model.count_params gives 162M, as for
Pythia-160M, the GPT-NeoX "125M" configuration with an untied output layer.
"""

from configs import base


def get_config():
  config = base.get_base_config()
  m = config.model
  m.position_encoding = 'dape_kerple'
  m.vocab_size = 50304  # GPT-NeoX tokenizer, padded
  m.hidden_size = 768
  m.num_layers = 12
  m.num_heads = 12
  m.ffn_size = 2048  # SwiGLU width: 3 x 768 x 2048 = 4.7M per layer, like a 4x GeLU MLP
  m.dape_hidden = 32
  m.block_size = 256
  config.data.dataset = 'arxiv'
  config.data.seq_len = 512
  config.data.tokenizer_vocab_size = 50304
  t = config.train
  t.batch_size = 32
  t.learning_rate = 6e-4
  t.end_learning_rate_ratio = 0.1
  t.schedule = 'cosine'
  t.b1 = 0.9
  t.b2 = 0.95
  t.weight_decay = 0.1
  t.grad_clip = 1.0
  t.warmup_steps = 1000
  t.steps = 50000
  return config
