"""Positional-encoding primitives: pure functions of positions plus small linen modules.

Biases are functions of (q_pos [B, Q], k_pos [B, K]) returning [B, H, Q, K] float32, so they can
be evaluated per attention block. See each module's docstring for the formula.
"""

from bipe_jax.encodings.absolute import LearnedPositionEmbedding
from bipe_jax.encodings.absolute import sinusoidal_embedding
from bipe_jax.encodings.alibi import alibi_bias
from bipe_jax.encodings.alibi import alibi_slopes
from bipe_jax.encodings.dape import DapeV1
from bipe_jax.encodings.dape import DapeV2
from bipe_jax.encodings.dape import dape_v1_transform
from bipe_jax.encodings.dape import dape_v2_transform
from bipe_jax.encodings.dape import dapev2_halo
from bipe_jax.encodings.fire import FireBias
from bipe_jax.encodings.fire import fire_bias
from bipe_jax.encodings.kerple import KERPLE_MIN
from bipe_jax.encodings.kerple import KerpleLogBias
from bipe_jax.encodings.kerple import clamp_straight_through
from bipe_jax.encodings.kerple import kerple_log_bias
from bipe_jax.encodings.rope import ROPE_SCALINGS
from bipe_jax.encodings.rope import apply_rope
from bipe_jax.encodings.rope import rope_attention_scale
from bipe_jax.encodings.rope import rope_inv_frequencies
from bipe_jax.encodings.rope import rope_log_scale
from bipe_jax.encodings.t5 import T5RelativeBias
from bipe_jax.encodings.t5 import t5_bias
from bipe_jax.encodings.t5 import t5_relative_bucket
