"""Generation: sampling filters (top-k / top-p / temperature) and KV-cached decoding vs full forward."""

import functools
import zlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import generation
from bipe_jax.generation import SamplingConfig
from tests import fixtures
from tests.scheme_cover import HOOK_COVER
from tests import forkserver


def _allowed_reference(logits_V, top_k, top_p, temperature):
  """Loop-based NumPy reference of the allowed set for one row."""
  logits_V = np.asarray(logits_V, np.float64)
  vocab = logits_V.shape[0]
  keep = np.ones(vocab, bool)
  if top_k and top_k < vocab:
    kth = np.sort(logits_V)[::-1][top_k - 1]
    keep = logits_V >= kth
  if top_p < 1.0:
    scaled = logits_V / (temperature if temperature > 0 else 1.0)
    ex = np.where(keep, np.exp(scaled - scaled[keep].max()), 0.0)
    probs = ex / ex.sum()
    order = sorted(range(vocab), key=lambda i: -probs[i])
    mass = 0.0
    nucleus = np.zeros(vocab, bool)
    for i in order:
      if mass >= top_p:
        break
      nucleus[i] = True
      mass += probs[i]
    keep &= nucleus
  return keep


def test_top_k_hand_example():
  logits = jnp.array([[1.0, 5.0, 3.0, 4.0, 2.0]])
  keep = generation.allowed_tokens(logits, top_k=2)
  np.testing.assert_array_equal(keep, [[False, True, False, True, False]])


@pytest.mark.parametrize('top_p,expected', [
    (0.5, [True, False, False, False]),   # the top token alone has mass 0.5
    (0.7, [True, True, False, False]),
    (0.81, [True, True, True, False]),
    (1.0, [True, True, True, True]),
])
def test_top_p_hand_example(top_p, expected):
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  keep = generation.allowed_tokens(logits, top_p=top_p)
  np.testing.assert_array_equal(keep, [expected])


@pytest.mark.parametrize('top_k,top_p,temperature', [(5, 1.0, 1.0), (0, 0.6, 0.7), (7, 0.8, 1.5)])
def test_allowed_matches_reference(top_k, top_p, temperature):
  logits = jax.random.normal(jax.random.PRNGKey(1), (16, 40)) * 3
  keep = np.asarray(generation.allowed_tokens(logits, top_k=top_k, top_p=top_p,
                                              temperature=temperature))
  for row in range(logits.shape[0]):
    np.testing.assert_array_equal(keep[row], _allowed_reference(logits[row], top_k, top_p,
                                                                temperature))


@pytest.mark.parametrize('top_k,top_p', [(4, 1.0), (0, 0.7), (6, 0.5)])
def test_sampling_never_draws_outside_allowed_set(top_k, top_p):
  rows, vocab, draws = 8, 30, 400
  logits = jax.random.normal(jax.random.PRNGKey(2), (rows, vocab)) * 2
  sampling = SamplingConfig(temperature=1.3, top_k=top_k, top_p=top_p)
  rngs = jax.random.split(jax.random.PRNGKey(3), draws)
  tokens = jax.jit(jax.vmap(lambda r: generation.sample_logits(logits, r, sampling)))(rngs)
  chex.assert_shape(tokens, (draws, rows))
  tokens = np.asarray(tokens)
  for row in range(rows):
    allowed = _allowed_reference(logits[row], top_k, top_p, 1.3)
    drawn = np.unique(tokens[:, row])
    assert allowed[drawn].all(), (row, drawn, np.flatnonzero(allowed))
  # Sampling really samples: with >= 2 allowed tokens somewhere, more than one value appears.
  assert max(len(np.unique(tokens[:, r])) for r in range(rows)) > 1


def test_sampling_frequencies_follow_renormalised_probabilities():
  logits = jnp.log(jnp.array([[0.4, 0.3, 0.2, 0.1]]))
  sampling = SamplingConfig(temperature=1.0, top_k=3)
  rngs = jax.random.split(jax.random.PRNGKey(4), 6000)
  tokens = np.asarray(jax.jit(jax.vmap(lambda r: generation.sample_logits(logits, r,
                                                                          sampling)))(rngs))
  freq = np.bincount(tokens[:, 0], minlength=4) / tokens.shape[0]
  np.testing.assert_allclose(freq, [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.0], atol=0.03)


def test_greedy_is_argmax():
  logits = jax.random.normal(jax.random.PRNGKey(5), (6, 50))
  tokens = generation.sample_logits(logits, jax.random.PRNGKey(0), SamplingConfig(temperature=0))
  np.testing.assert_array_equal(tokens, np.argmax(np.asarray(logits), axis=-1))
  assert tokens.dtype == jnp.int32


@pytest.mark.parametrize('kwargs,field', [({'temperature': -1.0}, 'temperature'),
                                          ({'top_k': -2}, 'top_k'),
                                          ({'top_p': 0.0}, 'top_p'),
                                          ({'top_p': 1.5}, 'top_p')])
def test_bad_sampling_config(kwargs, field):
  with pytest.raises(ValueError, match=field):
    SamplingConfig(**kwargs)


# ----------------------------------------------------------------------------- cached decoding

import flax.linen as nn  # pylint: disable=g-import-not-at-top,g-bad-import-order

from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
from tests.fixtures import tiny_model_config  # pylint: disable=g-import-not-at-top

SEPS = (2, 3)
# Row 0 ends with a separator (the first generated token starts a new segment); row 1 has two
# separators in a row and starts with BOS.
PROMPT = np.array([[4, 5, 2, 6, 7, 7, 3], [1, 5, 2, 3, 4, 6, 6]], np.int32)


@functools.lru_cache(maxsize=None)
def _tiny_model(name, num_layers=1, documents=False):
  fields = dict(vocab_size=8, hidden_size=32, num_layers=num_layers, num_heads=4,
                num_kv_heads=2, ffn_size=32, position_encoding=name, separators='ids',
                separator_ids=SEPS, max_intra=16, max_position=32, train_length=16,
                attention_impl='dense', bos_id=1, restart_at_documents=documents,
                mask_across_documents=documents)
  model = model_lib.Transformer(tiny_model_config(**fields))
  # Random parameters of the model's shapes (no init compile): matrices ~ N(0, 0.16^2), so
  # logits differ clearly between tokens and positions; vectors and scalars (norm scales, Kerple
  # p and a, FIRE c and L, DAPE biases) in [0.5, 1.5], positive as those parameters must be.
  shapes = nn.meta.unbox(jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32)))['params'])
  rng = np.random.default_rng(zlib.crc32(name.encode()))
  params = jax.tree.map(
      lambda s: (0.16 * rng.standard_normal(s.shape) if len(s.shape) >= 2
                 else rng.uniform(0.5, 1.5, s.shape)).astype(s.dtype), shapes)
  return model, params


@functools.lru_cache(maxsize=None)
def _jitted_apply(model):
  return jax.jit(model.apply)


def _check_against_full_forward(model, params, out, step_logits, prompt_len):
  full = np.asarray(_jitted_apply(model)({'params': params}, out))
  chex.assert_shape(step_logits, (out.shape[0], out.shape[1] - prompt_len, 8))
  # Generated token i was drawn from the logits at position prompt_len - 1 + i.
  np.testing.assert_allclose(np.asarray(step_logits), full[:, prompt_len - 1:-1],
                             atol=1e-4, rtol=1e-4)
  return full


def test_init_cache_equals_model_init_cache():
  model, _ = _tiny_model('bipe_alibi')
  init = jax.jit(functools.partial(model.init, decode=True))
  expected = init(jax.random.PRNGKey(0), jnp.zeros((2, 6), jnp.int32))["cache"]
  got = generation.init_cache(model, 2, 6)
  chex.assert_trees_all_equal(got, expected)


@pytest.mark.parametrize('name', HOOK_COVER)
def test_cached_generation_equals_full_forward(name):
  model, params = _tiny_model(name)
  new = 9
  greedy, greedy_logits = generation.generate(model, params, PROMPT, max_new_tokens=new,
                                              return_logits=True)
  chex.assert_shape(greedy, (2, PROMPT.shape[1] + new))
  np.testing.assert_array_equal(greedy[:, :PROMPT.shape[1]], PROMPT)
  full = _check_against_full_forward(model, params, greedy, greedy_logits, PROMPT.shape[1])
  np.testing.assert_array_equal(greedy[:, PROMPT.shape[1]:],
                                np.argmax(full[:, PROMPT.shape[1] - 1:-1], axis=-1))
  # Hot sampling: separators get generated, so new segments start during decoding.
  sampled, sampled_logits = generation.generate(
      model, params, PROMPT, max_new_tokens=new, sampling=SamplingConfig(temperature=4.0),
      rng=jax.random.PRNGKey(7), return_logits=True)
  _check_against_full_forward(model, params, sampled, sampled_logits, PROMPT.shape[1])
  fed_back = np.asarray(sampled[:, PROMPT.shape[1]:-1])
  assert np.isin(fed_back, SEPS).any(), 'no separator was decoded: no new segment was tested'


@pytest.mark.parametrize('documents', [False, True])
def test_generation_multi_layer_one_token_prompt_and_manual_steps(documents):
  """2 layers; a 1-token prompt; with documents, BOS (id 1) restarts positions and masks."""
  model, params = _tiny_model('bipe_rope', num_layers=2, documents=documents)
  prompt = np.array([[2], [5]], np.int32)
  out, logits = generation.generate(model, params, prompt, max_new_tokens=10,
                                    sampling=SamplingConfig(temperature=4.0),
                                    rng=jax.random.PRNGKey(1), return_logits=True)
  full = _check_against_full_forward(model, params, out, logits, 1)
  if documents:
    assert (np.asarray(out[:, 1:-1]) == 1).any(), 'no BOS decoded: no document restart tested'
  # The exported per-token API: prefill, then decode_step token by token (teacher forcing).
  cache = generation.init_cache(model, 2, out.shape[1])
  step_logits, cache = generation.prefill(model, params, cache, out[:, :3])
  rows = [step_logits]
  for t in range(3, out.shape[1]):
    step_logits, cache = generation.decode_step(model, params, cache, out[:, t:t + 1])
    rows.append(step_logits)
  np.testing.assert_allclose(np.concatenate(rows, axis=1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('sampling', [SamplingConfig(temperature=1.0, top_k=2),
                                      SamplingConfig(temperature=1.0, top_p=0.5)])
def test_generated_tokens_respect_filters(sampling):
  model, params = _tiny_model('bipe_rope')
  out, logits = generation.generate(model, params, np.tile(PROMPT, (4, 1)), max_new_tokens=8,
                                    sampling=sampling, rng=jax.random.PRNGKey(2),
                                    return_logits=True)
  p = PROMPT.shape[1]
  _check_against_full_forward(model, params, out, logits, p)
  logits = np.asarray(logits)
  drawn = np.asarray(out[:, p:])
  for b in range(drawn.shape[0]):
    for i in range(drawn.shape[1]):
      allowed = _allowed_reference(logits[b, i], sampling.top_k, sampling.top_p, 1.0)
      assert allowed[drawn[b, i]], (b, i, drawn[b, i], np.flatnonzero(allowed))


def test_eos_ends_rows_and_bad_arguments():
  model, params = _tiny_model('rope')
  out = np.asarray(generation.generate(model, params, PROMPT, max_new_tokens=8, eos_id=5,
                                       sampling=SamplingConfig(temperature=3.0),
                                       rng=jax.random.PRNGKey(3)))
  for row in out[:, PROMPT.shape[1]:]:
    hits = np.flatnonzero(row == 5)
    if hits.size:
      assert (row[hits[0]:] == 5).all()
  with pytest.raises(ValueError, match='rng'):
    generation.generate(model, params, PROMPT, max_new_tokens=2,
                        sampling=SamplingConfig(temperature=1.0))
  with pytest.raises(ValueError, match='max_new_tokens'):
    generation.generate(model, params, PROMPT, max_new_tokens=0)
  with pytest.raises(ValueError, match='prompt'):
    generation.generate(model, params, PROMPT[0], max_new_tokens=2)


@pytest.mark.slow
def test_generate_cli_on_converted_llama_matches_torch_greedy(tmp_path):
  """HF Llama -> converted workdir -> eval/generate.py greedy == a PyTorch argmax loop."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bipe_jax.interop import convert  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=64,
                                    bos_token_id=1, eos_token_id=None)
  reference = transformers.LlamaForCausalLM(config).eval()
  with torch.no_grad():
    for p in reference.parameters():
      p.mul_(20.0)
  reference.save_pretrained(str(tmp_path / 'hf'))
  workdir = str(tmp_path / 'workdir')
  convert.hf_to_workdir(str(tmp_path / 'hf'), workdir, separator_ids=(7, 9))
  prompt = [1, 5, 7, 11, 9]
  ids = list(prompt)
  with torch.no_grad():
    for _ in range(10):
      ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
  root = fixtures.ROOT
  proc = forkserver.run(
      [sys.executable, 'eval/generate.py', f'--workdir={workdir}',
       f'--prompt_ids={",".join(map(str, prompt))}', '--max_new_tokens=10', '--temperature=0'],
      cwd=root, env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith('ids: ')][0]
  assert [int(i) for i in line[5:].split(',')] == ids[len(prompt):], proc.stdout
