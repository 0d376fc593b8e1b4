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
MFU convention). Causal attention IS halved: the score and value matmuls count T_avg = (T + 1)/2
keys per query (the keys a causal query sees), not T; blockwise attention also skips the
blocks above the diagonal, so this is the work it does.

The peak MFU is measured against (`peak_flops_per_device`): the published dense (no sparsity)
peak of the device kind for the compute dtype — H100/H200 SXM: 989 TFLOP/s bfloat16, 494 TF32
(float32 matmuls on NVIDIA GPUs run as TF32 under XLA's default precision); A100: 312 / 156;
TPU v4: 275, v5e: 197, v5p: 459, v6e: 918 (bfloat16; float32 matmuls on TPU run as bfloat16
passes at default precision, so the same figure) — and on CPU the float32 matmul rate the CPU
seam records (bipe_jax/kernels/cpu.py, measured on the project's 2-core machine).
`train.peak_flops_per_device` > 0 overrides it.
"""

from bipe_jax.kernels import cpu as cpu_kernels


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


# Published dense peaks in FLOP/s per device: (device_kind substring, bfloat16, float32).
# The first match wins, so more specific names come first.
PUBLISHED_PEAKS = (
    ('h200', 989e12, 494e12),
    ('h100', 989e12, 494e12),
    ('a100', 312e12, 156e12),
    ('v6 lite', 918e12, 918e12),
    ('v6e', 918e12, 918e12),
    ('v5 lite', 197e12, 197e12),
    ('v5e', 197e12, 197e12),
    ('v5p', 459e12, 459e12),
    ('v5', 459e12, 459e12),
    ('v4', 275e12, 275e12),
)
CPU_PEAK_PER_HOST = cpu_kernels.PEAK_FLOPS_PER_HOST  # the CPU seam's measured figure


def peak_flops_per_device(device_kind: str, platform: str, dtype: str,
                          override: float = 0.0) -> tuple[float, str]:
  """(peak FLOP/s of one device, a description naming where it comes from). See the docstring.

  On CPU the figure is per host (one host's cores, however many JAX CPU devices split them).
  An unknown accelerator gives (0, ...): MFU is then not reported rather than wrong.
  """
  if override and override > 0:
    return float(override), f'{override:.3g} FLOP/s per device (train.peak_flops_per_device)'
  kind = device_kind.lower()
  if platform == 'cpu':
    return CPU_PEAK_PER_HOST, (f'{CPU_PEAK_PER_HOST:.3g} FLOP/s per host (float32 matmul rate '
                               'measured on the 2-core CPU machine; set '
                               'train.peak_flops_per_device for yours)')
  half = dtype in ('bfloat16', 'float16')
  for name, bf16, f32 in PUBLISHED_PEAKS:
    if name in kind:
      value = bf16 if half else f32
      return value, (f'{value / 1e12:.0f} TFLOP/s per device (published dense '
                     f'{"bfloat16" if half else "float32 (TF32 / bf16 passes)"} peak of '
                     f'{device_kind})')
  return 0.0, (f'no published peak known for {device_kind!r}: MFU not reported (set '
               'train.peak_flops_per_device)')
