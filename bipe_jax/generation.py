"""Autoregressive generation with the model's KV cache: greedy, temperature, top-k, top-p.

The model's `decode=True` mode keeps, in the flax collection `cache`, the keys and values of every
past token, their positions, and the running bilevel state (segment index, offset inside the
segment, whether the last token was a separator), so a token generated after a separator starts a
new segment exactly as it would in a full forward pass over the whole sequence.

Flow: `init_cache` builds an empty cache for [B, max_len] tokens; `prefill` runs the prompt
[B, P] through the model in one call (filling P cache slots; prompts of different lengths are
left-padded by `left_pad`, and the padding takes no position and is seen by no query); `decode_step` feeds one token [B, 1]
per call (jit-compiled once, reused for every position); `generate` ties them together and runs the
token loop inside `jax.lax.scan` (one compiled program for the whole continuation).

Sampling (pure functions, usable on any logits):
- temperature == 0: greedy (argmax);
- otherwise logits / temperature, then keep the top_k largest (top_k > 0) and the smallest set of
  most probable tokens whose probability reaches top_p (top_p < 1), then draw from the rest.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bipe_jax import input_checks

NEG_INF = -1e30  # finite, so that a row never becomes NaN


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How the next token is chosen from the logits.

  temperature: 0 = greedy; > 0 divides the logits.
  top_k: keep only the k most likely tokens (0 = all).
  top_p: keep the smallest set of most likely tokens whose total probability >= top_p (1 = all).
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not self.temperature >= 0.0:
      raise ValueError(f'temperature must be >= 0 (0 = greedy), got {self.temperature}')
    if not (isinstance(self.top_k, int) and self.top_k >= 0):
      raise ValueError(f'top_k must be an integer >= 0 (0 = no top-k filter), got {self.top_k}')
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f'top_p must be in (0, 1] (1 = no nucleus filter), got {self.top_p}')


def allowed_tokens(logits_BxV: jax.Array, *, top_k: int = 0, top_p=1.0,
                   temperature=1.0) -> jax.Array:
  """Boolean [B, V]: the tokens that sampling may draw (top-k and top-p filters combined).

  top-k (a Python int) keeps every token whose logit is >= the k-th largest (ties at the boundary
  are kept). top-p (a float or a traced scalar) ranks tokens by probability (softmax of
  logits / temperature, after top-k) and keeps a token when the probability mass of the tokens
  ranked before it is < top_p, so the most likely token is always kept and the kept mass is the
  smallest that reaches top_p; top_p >= 1 keeps everything.
  """
  logits = logits_BxV.astype(jnp.float32)
  vocab = logits.shape[-1]
  keep = jnp.ones(logits.shape, bool)
  if top_k and top_k < vocab:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    keep = logits >= kth
  if isinstance(top_p, (int, float)) and top_p >= 1.0:
    return keep
  temperature = jnp.asarray(temperature, jnp.float32)
  scaled = logits / jnp.where(temperature > 0, temperature, 1.0)
  probs = jax.nn.softmax(jnp.where(keep, scaled, NEG_INF), axis=-1)
  order = jnp.argsort(-probs, axis=-1)
  sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
  mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
  keep_sorted = (mass_before < top_p) | (jnp.asarray(top_p) >= 1.0)
  # Scatter the decision back from sorted order to vocabulary order.
  inverse = jnp.argsort(order, axis=-1)
  return keep & jnp.take_along_axis(keep_sorted, inverse, axis=-1)


def sample_logits(logits_BxV: jax.Array, rng: jax.Array,
                  sampling: SamplingConfig = SamplingConfig()) -> jax.Array:
  """Draws one token per row from logits [B, V]; returns int32 [B]."""
  return _sample(logits_BxV, rng, sampling.top_k, sampling.temperature, sampling.top_p)


def _sample(logits_BxV, rng, top_k: int, temperature, top_p) -> jax.Array:
  """sample_logits with temperature / top_p as (possibly traced) scalars; 0 temperature = argmax.

  Keeping them traced lets one compiled decoding loop serve greedy and sampled generation.
  """
  greedy = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  if isinstance(temperature, (int, float)) and temperature == 0:
    return greedy
  temperature = jnp.asarray(temperature, jnp.float32)
  keep = allowed_tokens(logits_BxV, top_k=top_k, top_p=top_p, temperature=temperature)
  scaled = logits_BxV.astype(jnp.float32) / jnp.where(temperature > 0, temperature, 1.0)
  drawn = jax.random.categorical(rng, jnp.where(keep, scaled, NEG_INF), axis=-1)
  return jnp.where(temperature > 0, drawn.astype(jnp.int32), greedy)


# ----------------------------------------------------------------------------- the cache loop


def init_cache(model, batch_size: int, max_len: int) -> Any:
  """An empty KV cache (flax collection `cache`) for up to `max_len` tokens per row.

  The model creates its cache in `model.init(..., decode=True)` with every entry zero (keys,
  values, positions, index, bilevel state). Only the shapes are traced here (jax.eval_shape:
  no parameter is initialised, no forward pass is compiled) and the entries are made zero.
  """
  tokens = jax.ShapeDtypeStruct((batch_size, max_len), jnp.int32)
  shapes = jax.eval_shape(
      lambda t: model.init(jax.random.PRNGKey(0), t, decode=True)['cache'], tokens)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _apply(model, params, cache, tokens_BxT, valid_BxT=None):
  logits, mutated = model.apply({'params': params, 'cache': cache}, tokens_BxT,
                                valid_BxT=valid_BxT, decode=True, mutable=['cache'])
  return logits, mutated['cache']


@functools.partial(jax.jit, static_argnums=(0,))
def prefill(model, params, cache, prompt_BxP: jax.Array, valid_BxP: Optional[jax.Array] = None):
  """Runs the prompt through the cache in one call; returns (logits [B, P, V], cache).

  valid_BxP: bool [B, P], False at (left) padding; None = every token is real.
  """
  return _apply(model, params, cache, prompt_BxP, valid_BxP)


def left_pad(prompts, pad_value: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Prompts of different lengths -> (tokens int32 [B, P], valid bool [B, P]), right-aligned.

  P is the longest prompt; shorter rows start with `pad_value` (any id: the mask, not the id,
  makes it padding). Every prompt needs at least one token.
  """
  rows = [np.asarray(p, np.int64).reshape(-1) for p in prompts]
  if not rows or min(len(r) for r in rows) < 1:
    raise ValueError('left_pad needs at least one prompt, each with at least one token')
  width = max(len(r) for r in rows)
  tokens = np.full((len(rows), width), pad_value, np.int32)
  valid = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):] = r
    valid[i, width - len(r):] = True
  return tokens, valid


def _check_left_padding(valid_BxP) -> None:
  valid = np.asarray(valid_BxP, bool)
  if not valid[:, -1].all() or (np.diff(valid.astype(np.int8), axis=1) < 0).any():
    raise ValueError('prompt_valid must be left padding: per row, False (padding) then True '
                     '(tokens), ending with a token; use generation.left_pad(prompts)')


@functools.partial(jax.jit, static_argnums=(0,))
def decode_step(model, params, cache, token_Bx1: jax.Array):
  """Feeds one token per row; returns (logits [B, 1, V], cache)."""
  return _apply(model, params, cache, token_Bx1)


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _continue(model, params, cache, last_logits_BxV, num_tokens: int, top_k: int,
              temperature, top_p, rng):
  """Samples `num_tokens` tokens, feeding each back; returns (tokens [B, N], logits [B, N, V]).

  One compiled program per (model, N, top_k): temperature (0 = greedy) and top_p are traced.
  """

  def step(carry, step_rng):
    cache, logits = carry
    token = _sample(logits, step_rng, top_k, temperature, top_p)
    new_logits, cache = _apply(model, params, cache, token[:, None])
    return (cache, new_logits[:, 0]), (token, logits)

  rngs = jax.random.split(rng, num_tokens)
  _, (tokens_NxB, logits_NxBxV) = jax.lax.scan(step, (cache, last_logits_BxV), rngs)
  return tokens_NxB.T, jnp.swapaxes(logits_NxBxV, 0, 1)


def generate(model, params, prompt_BxP, *, max_new_tokens: int,
             sampling: SamplingConfig = SamplingConfig(temperature=0.0),
             rng: Optional[jax.Array] = None, eos_id: Optional[int] = None,
             return_logits: bool = False, prompt_valid_BxP=None):
  """Continues every prompt row by `max_new_tokens` tokens with the KV cache.

  Args:
    model: a `bipe_jax.model.Transformer` (any position encoding).
    params: its parameters (the tree under `params`).
    prompt_BxP: int32 [B, P], P >= 1.
    prompt_valid_BxP: optional bool [B, P] for prompts of different lengths (see `left_pad`):
      False at the left padding, which takes no position and is attended by no query, so each
      row continues exactly as it would alone.
    max_new_tokens: N >= 1 tokens to generate.
    sampling: greedy by default.
    rng: PRNG key (needed unless greedy).
    eos_id: when given, every token after a row's first eos is replaced by eos (the model still
      runs the fixed N steps, so one compiled program serves every call).
    return_logits: also return the logits [B, N, V] each generated token was drawn from.

  Returns:
    int32 [B, P + N] (prompt followed by the continuation), and the logits if asked.
  """
  prompt = jnp.asarray(prompt_BxP, jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f'prompt must be int [batch, length >= 1], got shape {prompt.shape}')
  if max_new_tokens < 1:
    raise ValueError(f'max_new_tokens must be >= 1, got {max_new_tokens}')
  if sampling.temperature > 0 and rng is None:
    raise ValueError('sampling with temperature > 0 needs an rng key')
  rng = jax.random.PRNGKey(0) if rng is None else rng
  batch, prompt_len = prompt.shape
  if prompt_valid_BxP is not None:
    if np.shape(prompt_valid_BxP) != prompt.shape:
      raise ValueError(f'prompt_valid shape {np.shape(prompt_valid_BxP)} != prompt shape '
                       f'{prompt.shape}')
    _check_left_padding(prompt_valid_BxP)
    prompt_valid_BxP = jnp.asarray(prompt_valid_BxP, bool)
  input_checks.check_token_ids(prompt_BxP, model.config.vocab_size, 'prompt', prompt_valid_BxP)
  # The last generated token is never fed back, so P + N - 1 slots suffice; keep P + N.
  cache = init_cache(model, batch, prompt_len + max_new_tokens)
  logits, cache = prefill(model, params, cache, prompt, prompt_valid_BxP)
  tokens, step_logits = _continue(model, params, cache, logits[:, -1], max_new_tokens,
                                  sampling.top_k, jnp.float32(sampling.temperature),
                                  jnp.float32(sampling.top_p), rng)
  if eos_id is not None:
    seen = jnp.cumsum(tokens == eos_id, axis=1) - (tokens == eos_id)
    tokens = jnp.where(seen > 0, eos_id, tokens)
  out = jnp.concatenate([prompt, tokens], axis=1)
  return (out, step_logits) if return_logits else out


# ----------------------------------------------------------------------------- from a workdir


def generate_from_workdir(workdir: str, *, prompt: str = '', prompt_ids=None,
                          max_new_tokens: int = 64,
                          sampling: SamplingConfig = SamplingConfig(temperature=0.0),
                          num_samples: int = 1, seed: int = 0, step: Optional[int] = None,
                          stop_at_eos: bool = True) -> dict:
  """Continues a prompt with a workdir's checkpoint (training run or converted folder).

  The prompt is `prompt_ids` when given, else BOS + the run's tokenizer encoding of `prompt`.
  Returns {'step', 'encoding', 'prompt_ids', 'samples': [continuation ids], 'texts': [decoded
  continuations, or None without a tokenizer]}.
  """
  from bipe_jax.runs import restore as runs  # pylint: disable=g-import-not-at-top
  run = runs.load_run(workdir, step=step, attention_impl='dense')
  tokenizer = None
  try:
    from bipe_jax import data  # pylint: disable=g-import-not-at-top
    tokenizer = data.get_tokenizer(run.config.data)
    if tokenizer.vocab_size != run.model_config.vocab_size:
      tokenizer = None  # not the model's tokenizer: ids only
  except Exception:  # pylint: disable=broad-except
    pass
  if tokenizer is None:
    if prompt_ids is None:
      raise ValueError(f'no tokenizer could be loaded for {workdir!r} (data.tokenizer_path / '
                       'data.data_dir) with vocab_size '
                       f'{run.model_config.vocab_size}; give the prompt as token ids '
                       '(--prompt_ids)')
  if prompt_ids is None:
    bos = run.model_config.bos_id
    prompt_ids = ([bos] if bos >= 0 else []) + [int(i) for i in tokenizer.encode(prompt)]
  prompt_ids = [int(i) for i in prompt_ids]
  vocab = run.model_config.vocab_size
  bad = [i for i in prompt_ids if not 0 <= i < vocab]
  if not prompt_ids or bad:
    raise ValueError(f'prompt ids must be a non-empty list in 0..{vocab - 1}; got {prompt_ids}')
  eos = run.model_config.eos_id if stop_at_eos and run.model_config.eos_id >= 0 else None
  batch = jnp.tile(jnp.asarray(prompt_ids, jnp.int32)[None], (num_samples, 1))
  with run.context():
    out = generate(run.model, run.params, batch, max_new_tokens=max_new_tokens,
                   sampling=sampling, rng=jax.random.PRNGKey(seed), eos_id=eos)
  samples = []
  for row in jax.device_get(out)[:, len(prompt_ids):].tolist():
    if eos is not None and eos in row:
      row = row[:row.index(eos) + 1]
    samples.append(row)
  texts = [tokenizer.decode(s) for s in samples] if tokenizer is not None else [None] * len(samples)
  return {'step': run.step, 'encoding': run.encoding, 'prompt_ids': prompt_ids,
          'samples': samples, 'texts': texts}
