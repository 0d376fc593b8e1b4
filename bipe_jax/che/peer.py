"""The benchmark's own encoder block (Ruoss et al. 2023, google-deepmind/
randomized_positional_encodings, models/transformer.py), with this project's attention and
encodings: `--architecture=peer` of the CHE CLIs.

  h    = embed(tokens) * sqrt(D)                      token embeddings, no bias
  h    = dropout(h + pos(positions))                  only for an input (absolute) encoding;
                                                      without one, h is not dropped (as there)
  per layer:
    a  = LayerNorm(h + dropout(attention(h)))          q, k, v, out projections without bias
    h  = LayerNorm(a + dropout(W2 relu(W1 a + b1) + b2))   W1 [D, 4D], W2 [4D, D], biases
  logits = h W + b                                    the output head, with a bias; no final norm

Post-LayerNorm (scale and offset, eps 1e-5, the variance E[(x - mean)^2]), ReLU, dropout 0.1
on the embeddings (when an input encoding is added), the attention output and the MLP output;
none inside attention. The attention is this project's (`bipe_jax.model.Attention`) with the
encoding's positions: RoPE, the two-sided biases, DAPE, FoX, CoPE, BiPE's streams as in the
project's block. Padding keys are masked.

Initialisation as Haiku's defaults there: linear kernels truncated normal (at 2 std) of std
1/sqrt(fan_in), biases 0; token embeddings truncated normal of std 0.02; LayerNorm scale 1,
offset 0 (`init_params` re-draws the attention projections, which the project initialises at
std 0.02). Encoding parameters keep the project's initialisation.

Dropout needs an rng ('dropout') when `deterministic=False` (training); scoring runs with
`deterministic=True`, no dropout. (The benchmark's range evaluation calls its model with an rng,
so its scores are computed with dropout still on; here they are not.)

Parameter tree: embed/embedding [V, D]; abs_embed | intra_embed (input encodings);
layer_{i}/attention/... (as the project's), layer_{i}/{attention_norm,mlp_norm}/{scale,bias}
[D], layer_{i}/mlp_in/{kernel [D, F], bias [F]}, layer_{i}/mlp_out/{kernel [F, D], bias [D]};
head/{kernel [D, C], bias [C]}.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from bipe_jax import model as model_lib
from bipe_jax import positions as positions_lib
from bipe_jax.config import ModelConfig

DROPOUT = 0.1  # the benchmark's dropout_prob (experiments/example.py)
EMBED_STD = 0.02  # its emb_init_scale
LAYER_NORM_EPS = 1e-5  # hk.LayerNorm's default


def linear_init(fan_in: int):
  """Haiku's default linear init: truncated normal (at +-2 std) of std 1/sqrt(fan_in)."""
  return nn.initializers.truncated_normal(stddev=1.0 / math.sqrt(fan_in))


def _layer_norm(name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=LAYER_NORM_EPS, use_fast_variance=False, name=name)


class PeerLayer(nn.Module):
  """One post-LayerNorm block: [B, T, D] -> [B, T, D]."""
  config: ModelConfig
  dropout: float

  @nn.compact
  def __call__(self, h_BxTxD: jax.Array, side: model_lib.Side, deterministic: bool):
    cfg = self.config
    d, f = cfg.hidden_size, cfg.ffn_size
    drop = lambda x: nn.Dropout(self.dropout)(x, deterministic=deterministic)
    a = model_lib.Attention(cfg, mask_keys=True, name='attention')(
        h_BxTxD, side, side, jnp.zeros((), jnp.int32))
    a = _layer_norm('attention_norm')(h_BxTxD + drop(a))
    m = nn.Dense(f, kernel_init=linear_init(d), name='mlp_in')(a)
    m = nn.Dense(d, kernel_init=linear_init(f), name='mlp_out')(nn.relu(m))
    return _layer_norm('mlp_norm')(a + drop(m))


class PeerEncoder(nn.Module):
  """__call__(tokens [B, T], positions) -> logits [B, T, output_size] float32; keys where
  positions.valid is False (padding) are masked."""
  config: ModelConfig
  output_size: int
  dropout: float = DROPOUT

  @nn.compact
  def __call__(self, tokens_BxT: jax.Array, *, positions: positions_lib.BilevelPositions,
               deterministic: bool = True) -> jax.Array:
    cfg = self.config
    if cfg.compute_dtype != jnp.float32:
      raise ValueError(f'the peer block runs in float32, not model.dtype={cfg.dtype!r}.')
    b, t = tokens_BxT.shape
    index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    side = model_lib.Side.from_positions(positions, index)
    if cfg.scheme.rotary != 'none':
      cos, sin = model_lib.rotary_tables(cfg, side)
      side = side.replace(rope_cos=cos, rope_sin=sin)
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, embedding_init=
                     nn.initializers.truncated_normal(stddev=EMBED_STD), name='embed')
    h = embed(tokens_BxT) * math.sqrt(cfg.hidden_size)
    if cfg.scheme.input != 'none':
      h = nn.Dropout(self.dropout)(h + model_lib.input_positions(cfg, side),
                                   deterministic=deterministic)
    for i in range(cfg.num_layers):
      h = PeerLayer(cfg, self.dropout, name=f'layer_{i}')(h, side, deterministic)
    logits = nn.Dense(self.output_size, kernel_init=linear_init(cfg.hidden_size),
                      name='head')(h)
    return logits.astype(jnp.float32)


PROJECTIONS = ('query', 'key', 'value', 'out')


def init_params(module: PeerEncoder, seed: int, tokens: int = 8) -> dict:
  """The module's parameters for `seed`, the attention projections re-drawn as Haiku's linear
  default: std 1/sqrt(fan_in), fan-in D for q, k, v and H * Dh for the output."""
  cfg = module.config
  rng_init, rng_proj = jax.random.split(jax.random.PRNGKey(seed))
  x = jnp.zeros((1, tokens), jnp.int32)
  pos = positions_lib.BilevelPositions(token=x, intra=x, inter=x, document=x,
                                       valid=jnp.ones_like(x, bool))
  params = nn.meta.unbox(module.init(rng_init, x, positions=pos)['params'])
  params = dict(params)  # edited below without touching the init's tree
  fan_in = dict(query=cfg.hidden_size, key=cfg.hidden_size, value=cfg.hidden_size,
                out=cfg.num_heads * cfg.head_size)
  keys = iter(jax.random.split(rng_proj, cfg.num_layers * len(PROJECTIONS)))
  for i in range(cfg.num_layers):
    layer = dict(params[f'layer_{i}'])
    attention = dict(layer['attention'])
    for name in PROJECTIONS:
      kernel = attention[name]['kernel']
      attention[name] = dict(attention[name], kernel=linear_init(fan_in[name])(
          next(keys), kernel.shape, kernel.dtype))
    layer['attention'] = attention
    params[f'layer_{i}'] = layer
  return params
