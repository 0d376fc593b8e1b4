"""An explicit FLOPs-per-token formula for the decoder, and MFU.

Counts multiply-adds as 2 FLOPs, matmuls only (norms, softmax, rotary and elementwise
biases are lower order). Per token, per layer, forward:

  q, k, v, out projections   2 * D * (H*Dh + 2*G*Dh) + 2 * H*Dh * D
  attention scores q.k       2 * H * Dh * T_avg       T_avg = (T + 1) / 2 keys (causal)
  attention values p.v       2 * H * Dh * T_avg
  SwiGLU MLP                 3 * 2 * D * F
  FIRE bias MLP (1->h->H)    2 * (h + h*H) * T_avg                  (fire, bipe_fire, dape_fire)
  DAPE V1 MLP (2H->h->H)     2 * (2H*h + h*H) * T_avg               (dape_*, bipe_dape_*)
  DAPE V2 conv (kernel k)    2 * (2H*h + h*H) * k * T_avg           (dapev2_*)

plus the unembedding 2 * D * V once per token. Training = 3 x forward (backward is twice the
forward); rematerialisation recomputes the forward but is not counted (model FLOPs, the usual
MFU convention).
"""


def _get(config, name, default=None):
  return getattr(config, name, default) if not isinstance(config, dict) else config.get(name, default)


def forward_flops_per_token(model_config, seq_len: int) -> float:
  """Forward-pass FLOPs per token of the model at training length `seq_len`."""
  d = int(_get(model_config, 'hidden_size'))
  h = int(_get(model_config, 'num_heads'))
  g = int(_get(model_config, 'num_kv_heads', 0)) or h
  dh = int(_get(model_config, 'head_dim', 0)) or d // h
  f = int(_get(model_config, 'ffn_size'))
  v = int(_get(model_config, 'vocab_size'))
  layers = int(_get(model_config, 'num_layers'))
  scheme = str(_get(model_config, 'position_encoding', ''))
  t_avg = (seq_len + 1) / 2.0

  projections = 2 * d * (h * dh + 2 * g * dh) + 2 * h * dh * d
  attention = 2 * 2 * h * dh * t_avg
  mlp = 3 * 2 * d * f
  extra = 0.0
  if 'fire' in scheme:
    fh = int(_get(model_config, 'fire_hidden', 32))
    extra += 2 * (fh + fh * h) * t_avg
  if 'dapev2' in scheme:
    dh_ = int(_get(model_config, 'dape_hidden', 32))
    k = int(_get(model_config, 'dapev2_kernel', 3))
    extra += 2 * (2 * h * dh_ + dh_ * h) * k * t_avg
  elif 'dape' in scheme:
    dh_ = int(_get(model_config, 'dape_hidden', 32))
    extra += 2 * (2 * h * dh_ + dh_ * h) * t_avg
  return float(layers * (projections + attention + mlp + extra) + 2 * d * v)


def train_flops_per_token(model_config, seq_len: int) -> float:
  """Training FLOPs per token: forward + backward = 3 x forward."""
  return 3.0 * forward_flops_per_token(model_config, seq_len)


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops: float) -> float:
  """Model FLOPs utilisation in [0, 1]: achieved FLOP/s over the peak of the devices used."""
  if peak_flops <= 0:
    return 0.0
  return tokens_per_second * flops_per_token / peak_flops
