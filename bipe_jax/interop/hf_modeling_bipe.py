"""PyTorch model of a bipe_jax export: copied as `modeling_bipe.py` into every exported Hugging
Face folder of an `alibi`, `bipe_rope` or `bipe_alibi` model, and registered in its config.json
through `auto_map`, so that

    transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

loads the model it is (logits equal bipe_jax's). This file needs only torch and transformers; it
never imports bipe_jax (it runs where bipe_jax is not installed).

The model is Hugging Face's Llama (RMSNorm, SwiGLU, grouped-query attention, the same tensor
names) with the position information of the encoding (config.json `rpe_type`):
- bilevel positions from the token ids: a token's segment (`inter`) is the number of separators
  (`bipe_separator_ids`) before it, its offset in the segment (`intra`) counts from 0 after
  each separator; a separator ends its segment;
- bipe_*: the token embedding plus the intra table `model.embeds.0.weight` [train_scale, D] at
  min(intra, train_scale - 1);
- bipe_rope: RoPE on the inter positions; alibi / bipe_alibi: no RoPE, an ALiBi bias
  -slope_h * (p_i - p_j) on the token positions (alibi) or the inter positions (bipe_alibi,
  slopes x96 as in the official BiPE code), passed to every layer as a float attention mask.
The forward pass is over the whole sequence (positions need every earlier token): `generate`
runs without a key/value cache (`use_cache` is ignored), each step recomputing the sequence.
A 2-D `attention_mask` (1 = token, 0 = padding) hides padding keys; padding still counts in
the positions, so pad on the right.
"""

import math

import torch
from transformers import LlamaConfig
from transformers import LlamaForCausalLM

OFFICIAL_SEPARATOR_IDS = (869, 13)  # '▁.' and newline in Llama's tokenizer
SLOPE_FACTOR = {'alibi': 1.0, 'bipe_alibi': 96.0}
ENCODINGS = ('alibi', 'bipe_rope', 'bipe_alibi')
BILEVEL_ENCODINGS = ('bipe_rope', 'bipe_alibi')  # with the intra-segment embedding


class BipeLlamaConfig(LlamaConfig):
  """Llama's configuration plus the encoding's keys (rpe_type, train_scale,
  bipe_separator_ids), kept as attributes from config.json."""
  model_type = 'bipe_llama'


def alibi_slopes(num_heads: int) -> torch.Tensor:
  """ALiBi head slopes [H] (Press et al.; the non-power-of-two interleaving of the paper)."""
  def powers(n):
    start = 2.0**(-2.0**-(math.log2(n) - 3))
    return [start * start**i for i in range(n)]
  if math.log2(num_heads).is_integer():
    return torch.tensor(powers(num_heads), dtype=torch.float64)
  closest = 2**math.floor(math.log2(num_heads))
  rest = alibi_slopes(2 * closest)[0::2][:num_heads - closest]
  return torch.cat([torch.tensor(powers(closest), dtype=torch.float64), rest])


def bilevel_positions(input_ids: torch.Tensor, separator_ids) -> tuple:
  """(intra, inter) [B, T] int64 of token ids [B, T]: inter counts the separators before a token,
  intra its offset since the last one (a separator belongs to the segment it ends)."""
  is_sep = torch.zeros_like(input_ids, dtype=torch.bool)
  for i in separator_ids:
    is_sep |= input_ids == int(i)
  before = torch.cumsum(is_sep.long(), dim=1) - is_sep.long()  # separators strictly before
  index = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
  # index of the token after the last separator before each token (0 when none)
  start = torch.where(is_sep, index + 1, torch.zeros_like(index))
  start = torch.cummax(start, dim=1).values
  start = torch.cat([torch.zeros_like(start[:, :1]), start[:, :-1]], dim=1)
  return index - start, before


class BipeLlamaForCausalLM(LlamaForCausalLM):
  """LlamaForCausalLM with the bilevel / ALiBi positions of `config.rpe_type`."""
  config_class = BipeLlamaConfig

  def __init__(self, config):
    super().__init__(config)
    encoding = getattr(config, 'rpe_type', None)
    if encoding not in ENCODINGS:
      raise ValueError(f'config.json rpe_type {encoding!r}: this modeling file covers '
                       f'{ENCODINGS} (a rope model is a plain LlamaForCausalLM)')
    self.encoding = encoding
    self.train_scale = int(getattr(config, 'train_scale', config.max_position_embeddings))
    self.separator_ids = tuple(getattr(config, 'bipe_separator_ids', None)
                               or OFFICIAL_SEPARATOR_IDS)
    if encoding in BILEVEL_ENCODINGS:
      # Official name: model.embeds.0.weight (a list of tables, the intra one first).
      self.model.embeds = torch.nn.ModuleList(
          [torch.nn.Embedding(self.train_scale, config.hidden_size)])
    self.post_init()

  def _attention_bias(self, pos_BxT, dtype, key_mask_BxT):
    """Float mask [B, H, T, T]: the ALiBi bias (zero without ALiBi), causal and padding -inf."""
    t = pos_BxT.shape[1]
    if self.encoding in SLOPE_FACTOR:
      slopes = (alibi_slopes(self.config.num_attention_heads) * SLOPE_FACTOR[self.encoding])
      distance = (pos_BxT[:, :, None] - pos_BxT[:, None, :]).double()  # [B, T, T]
      bias = -slopes.to(pos_BxT.device)[None, :, None, None] * distance[:, None]
    else:
      bias = torch.zeros((pos_BxT.shape[0], 1, t, t), dtype=torch.float64,
                         device=pos_BxT.device)
    allowed = torch.ones((t, t), dtype=torch.bool, device=pos_BxT.device).tril()[None, None]
    if key_mask_BxT is not None:
      allowed = allowed & key_mask_BxT.bool()[:, None, None, :]
    bias = bias.to(dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return bias

  def forward(self, input_ids=None, attention_mask=None, position_ids=None,
              past_key_values=None, inputs_embeds=None, labels=None, use_cache=None,
              **kwargs):
    del position_ids, past_key_values, use_cache  # positions come from the token ids
    if input_ids is None or inputs_embeds is not None:
      raise ValueError('BipeLlamaForCausalLM needs input_ids (its positions are computed from '
                       'the separators among them), not inputs_embeds')
    intra, inter = bilevel_positions(input_ids, self.separator_ids)
    embeds = self.model.embed_tokens(input_ids)
    if self.encoding in BILEVEL_ENCODINGS:
      embeds = embeds + self.model.embeds[0](intra.clamp(max=self.train_scale - 1))
    token = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    if self.encoding == 'bipe_rope':
      rotary = inter
      biased = token
    else:  # ALiBi: position 0 everywhere leaves RoPE's rotation the identity
      rotary = torch.zeros_like(inter)
      biased = token if self.encoding == 'alibi' else inter
    key_mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
    mask = self._attention_bias(biased, embeds.dtype, key_mask)
    if self.encoding == 'bipe_rope':
      mask = mask[:, :1]  # no bias: one mask for all heads
    return super().forward(inputs_embeds=embeds, attention_mask=mask, position_ids=rotary,
                           labels=labels, use_cache=False, **kwargs)

  def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
    """Every generation step sees the whole sequence (no key/value cache)."""
    return {'input_ids': input_ids, 'attention_mask': attention_mask}
