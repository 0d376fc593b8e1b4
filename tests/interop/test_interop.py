"""Interop with the Hugging Face Llama format: folders, parameter mapping, logits, round trips.

References are independent of bipe_jax's model: PyTorch `transformers.LlamaForCausalLM` itself, and a
loop-based NumPy re-implementation of the official BiPE forward (bilevel ids as in the official
`get_bilevel_ids`, the learned intra table, RoPE on inter ids, ALiBi x96 on segment ids).
"""

import json
import math
import os
import sys

import numpy as np
import pytest
import torch
import transformers

from bipe_jax.interop import hf_files
from bipe_jax.interop import hf_llama
from tests import fixtures
from tests import forkserver

# the official code's rpe_type values that add the intra table and rotate / bias by segments
OFFICIAL_BIPE_TYPES = ('bipe_rope', 'bipe_alibi')

VOCAB = 900  # > 869 so the official separators {869, 13} exist
SEPARATORS = (869, 13)


# ------------------------------------------------------------------ independent references


def _official_bilevel_ids(ids_T, train_scale):
  """Loop version of the official get_bilevel_ids: (intra clamped to train_scale-1, inter)."""
  intra, inter = [], []
  seg, off = 0, 0
  for tok in ids_T:
    intra.append(min(off, train_scale - 1))
    inter.append(seg)
    if tok in SEPARATORS:
      seg, off = seg + 1, 0
    else:
      off += 1
  return np.array(intra), np.array(inter)


def _official_alibi_slopes(n):
  def power_of_2(n):
    start = 2**(-2**-(math.log2(n) - 3))
    return [start * start**i for i in range(n)]
  if math.log2(n).is_integer():
    return power_of_2(n)
  closest = 2**math.floor(math.log2(n))
  return power_of_2(closest) + _official_alibi_slopes(2 * closest)[0::2][:n - closest]


def _rms(x, w, eps):
  return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def _rope(x_HxTxDh, pos_T, base):
  dh = x_HxTxDh.shape[-1]
  inv = 1.0 / base**(np.arange(0, dh, 2) / dh)
  ang = pos_T[:, None] * inv[None, :]
  cos = np.cos(np.concatenate([ang, ang], -1))
  sin = np.sin(np.concatenate([ang, ang], -1))
  half = dh // 2
  rot = np.concatenate([-x_HxTxDh[..., half:], x_HxTxDh[..., :half]], -1)
  return x_HxTxDh * cos + rot * sin


def numpy_official_forward(weights, hf, ids_T):
  """Float64 NumPy forward of the official (HF-Llama-based) BiPE models on one row of ids.

  weights: Hugging Face tensor names -> arrays ([out, in] layout).
  """
  w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
  rpe = hf.get('rpe_type', 'rope')
  t = len(ids_T)
  d, h = hf['hidden_size'], hf['num_attention_heads']
  g = hf.get('num_key_value_heads') or h
  dh = d // h
  eps = hf['rms_norm_eps']
  intra, inter = _official_bilevel_ids(ids_T, hf.get('train_scale', 1024))
  x = w['model.embed_tokens.weight'][ids_T]
  if rpe in OFFICIAL_BIPE_TYPES:
    x = x + w['model.embeds.0.weight'][intra]
  pos = inter if rpe in OFFICIAL_BIPE_TYPES else np.arange(t)
  bias = np.zeros((h, t, t))
  if rpe.endswith('alibi'):
    slopes = np.array(_official_alibi_slopes(h)) * (96.0 if rpe == 'bipe_alibi' else 1.0)
    for i in range(t):
      for j in range(t):
        bias[:, i, j] = -slopes * (pos[i] - pos[j])
  causal = np.tril(np.ones((t, t), bool))
  for layer in range(hf['num_hidden_layers']):
    p = f'model.layers.{layer}.'
    y = _rms(x, w[p + 'input_layernorm.weight'], eps)
    q = (y @ w[p + 'self_attn.q_proj.weight'].T).reshape(t, h, dh).transpose(1, 0, 2)
    k = (y @ w[p + 'self_attn.k_proj.weight'].T).reshape(t, g, dh).transpose(1, 0, 2)
    v = (y @ w[p + 'self_attn.v_proj.weight'].T).reshape(t, g, dh).transpose(1, 0, 2)
    if rpe.endswith('rope'):
      q, k = _rope(q, pos, 10000.0), _rope(k, pos, 10000.0)
    k, v = np.repeat(k, h // g, axis=0), np.repeat(v, h // g, axis=0)
    s = q @ k.transpose(0, 2, 1) / math.sqrt(dh) + bias
    s = np.where(causal, s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a = a / a.sum(-1, keepdims=True)
    o = (a @ v).transpose(1, 0, 2).reshape(t, h * dh)
    x = x + o @ w[p + 'self_attn.o_proj.weight'].T
    y = _rms(x, w[p + 'post_attention_layernorm.weight'], eps)
    gate = y @ w[p + 'mlp.gate_proj.weight'].T
    up = y @ w[p + 'mlp.up_proj.weight'].T
    x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + 'mlp.down_proj.weight'].T
  x = _rms(x, w['model.norm.weight'], eps)
  head = w.get('lm_head.weight', w['model.embed_tokens.weight'])
  return x @ head.T


# ------------------------------------------------------------------ fixtures


def _tiny_llama_config(**kw):
  args = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-5)
  args.update(kw)
  return transformers.LlamaConfig(**args)


def _random_llama(seed=0, **kw):
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(_tiny_llama_config(**kw)).eval()
  with torch.no_grad():  # norms away from 1 so a wrong mapping of a scale shows
    for name, p in model.named_parameters():
      if 'norm' in name:
        p.copy_(1 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(0.2 * torch.randn_like(p))
  return model


@pytest.fixture(scope='module')
def llama_folder(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp('llama'))
  model = _random_llama()
  model.save_pretrained(folder, safe_serialization=True)
  return folder, model


def _bipe_folder(path, rpe_type, train_scale=8, seed=1, num_heads=4, kv_heads=4):
  """A hand-built official-format folder: Llama weights (+ model.embeds.0.weight for bipe_*)."""
  model = _random_llama(seed, num_attention_heads=num_heads, num_key_value_heads=kv_heads)
  weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  if rpe_type in OFFICIAL_BIPE_TYPES:
    rng = np.random.default_rng(seed)
    intra = (0.5 * rng.standard_normal((train_scale, 32))).astype(np.float32)
    intra[-1] = 0.0  # official padding_idx=-1 keeps the last row at zero
    weights['model.embeds.0.weight'] = intra
  hf = json.loads(model.config.to_json_string())
  hf.update(rpe_type=rpe_type, train_scale=train_scale, log_scale=False, pad_token_id=-1,
            rope_theta=10000.0)
  hf.pop('rope_parameters', None)
  hf_files.write_hf_folder(str(path), hf, weights)
  return hf, weights


def _ids_with_segments(length, seed):
  rng = np.random.default_rng(seed)
  ids = rng.integers(20, VOCAB, size=length)
  sep_at = rng.random(length) < 0.25
  ids[sep_at] = rng.choice(SEPARATORS, size=sep_at.sum())
  return ids


# ------------------------------------------------------------------ folder reading / mapping


def test_reads_safetensors_bin_and_shards_identically(llama_folder, tmp_path):
  folder, model = llama_folder
  config = hf_files.read_hf_config(folder)
  state = model.state_dict()
  # A PyTorch pickle (.bin) folder, with float16 weights as the released checkpoints.
  bin_folder = tmp_path / 'bin'
  bin_folder.mkdir()
  torch.save({k: v.half() for k, v in state.items()}, bin_folder / 'pytorch_model.bin')
  (bin_folder / 'config.json').write_text(json.dumps(config))
  # A sharded safetensors folder with its index.
  shard_folder = tmp_path / 'shards'
  names = sorted(state)
  shard_of = {n: f'model-0000{i % 2 + 1}-of-00002.safetensors' for i, n in enumerate(names)}
  from safetensors.numpy import save_file
  shard_folder.mkdir()
  for shard in set(shard_of.values()):
    save_file({n: state[n].numpy() for n in names if shard_of[n] == shard},
              str(shard_folder / shard))
  (shard_folder / 'model.safetensors.index.json').write_text(json.dumps({'weight_map': shard_of}))

  a = hf_files.read_hf_weights(folder)
  b = hf_files.read_hf_weights(str(bin_folder))
  c = hf_files.read_hf_weights(str(shard_folder))
  assert sorted(a) == sorted(b) == sorted(c) == names
  for k in a:
    assert a[k].dtype == b[k].dtype == np.float32
    np.testing.assert_array_equal(a[k], c[k])
    np.testing.assert_array_equal(b[k], state[k].half().float().numpy())


def test_bfloat16_safetensors_read_as_float32(tmp_path):
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  x = np.array([[1.5, -2.25], [3.0, 0.0078125]], np.float32)
  save_file({'a': x.astype(ml_dtypes.bfloat16)}, str(tmp_path / 'model.safetensors'))
  got = hf_files.read_hf_weights(str(tmp_path))['a']
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got, x)


def test_bin_without_torch_says_so(tmp_path, monkeypatch):
  (tmp_path / 'pytorch_model.bin').write_bytes(b'not read')
  monkeypatch.setitem(sys.modules, 'torch', None)  # `import torch` now raises ImportError
  with pytest.raises(ImportError, match='needs PyTorch'):
    hf_files.read_hf_weights(str(tmp_path))


def test_missing_folder_and_weights_errors(tmp_path):
  with pytest.raises(ValueError, match='config.json'):
    hf_files.read_hf_config(str(tmp_path))
  with pytest.raises(ValueError, match='model.safetensors'):
    hf_files.weight_files(str(tmp_path))


def test_config_mapping(llama_folder):
  folder, _ = llama_folder
  m = hf_llama.model_fields_from_hf_config(hf_files.read_hf_config(folder))
  assert m['position_encoding'] == 'rope'
  assert (m['vocab_size'], m['hidden_size'], m['num_layers']) == (VOCAB, 32, 2)
  assert (m['num_heads'], m['num_kv_heads'], m['ffn_size']) == (4, 2, 48)
  assert m['rms_eps'] == 1e-5 and m['rope_base'] == 10000.0
  assert m['separator_ids'] == SEPARATORS


def test_config_mapping_bipe_alibi_official_options():
  hf = {'vocab_size': 32000, 'hidden_size': 768, 'num_hidden_layers': 12,
        'num_attention_heads': 12, 'num_key_value_heads': 12, 'intermediate_size': 3072,
        'rms_norm_eps': 1e-5, 'rpe_type': 'bipe_alibi', 'train_scale': 1024,
        'max_position_embeddings': 1024, 'pad_token_id': -1, 'rope_theta': 5e5}
  m = hf_llama.model_fields_from_hf_config(hf)
  assert m['position_encoding'] == 'bipe_alibi'
  assert m['alibi_slope_factor'] == 96.0
  assert m['max_intra'] == 1024 and m['separator_ids'] == (869, 13)
  assert m['rope_base'] == 5e5 and m['pad_id'] == -1
  assert not m['restart_at_documents'] and not m['mask_across_documents']


@pytest.mark.parametrize('patch,word', [({'rpe_type': 'xpos'}, 'rpe_type'),
                                        ({'hidden_act': 'gelu'}, 'hidden_act'),
                                        ({'attention_bias': True}, 'attention_bias'),
                                        ({'rope_scaling': {'type': 'dynamic', 'factor': 2.0}},
                                         'dynamic'),
                                        ({'model_type': 'gpt2'}, 'model_type')])
def test_config_mapping_rejects_unsupported(patch, word):
  hf = {'vocab_size': 100, 'hidden_size': 32, 'num_hidden_layers': 1,
        'num_attention_heads': 4, 'intermediate_size': 64}
  hf.update(patch)
  with pytest.raises(ValueError, match=word):
    hf_llama.model_fields_from_hf_config(hf)


def test_param_shapes_and_kernel_layout(llama_folder):
  folder, model = llama_folder
  hf = hf_files.read_hf_config(folder)
  m = hf_llama.model_fields_from_hf_config(hf)
  params = hf_llama.params_from_hf_weights(hf_files.read_hf_weights(folder), m)
  att = params['layer_1']['attention']
  assert att['query']['kernel'].shape == (32, 4, 8)
  assert att['key']['kernel'].shape == (32, 2, 8)
  assert att['out']['kernel'].shape == (4, 8, 32)
  assert params['lm_head']['kernel'].shape == (32, VOCAB)
  # Head h of our query kernel is rows h*Dh:(h+1)*Dh of the PyTorch weight, transposed.
  wq = model.model.layers[1].self_attn.q_proj.weight.detach().numpy()
  np.testing.assert_array_equal(att['query']['kernel'][:, 2, :], wq[16:24].T)


def test_numpy_reference_matches_torch(llama_folder):
  """The NumPy reference used below agrees with transformers itself on a plain Llama."""
  folder, model = llama_folder
  ids = _ids_with_segments(20, 0)
  with torch.no_grad():
    expected = model(torch.tensor(ids[None])).logits[0].numpy()
  got = numpy_official_forward(hf_files.read_hf_weights(folder), hf_files.read_hf_config(folder),
                               ids)
  np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def test_missing_and_unknown_tensors(llama_folder):
  folder, _ = llama_folder
  hf = hf_files.read_hf_config(folder)
  m = hf_llama.model_fields_from_hf_config(hf)
  weights = hf_files.read_hf_weights(folder)
  broken = dict(weights)
  del broken['model.layers.1.mlp.up_proj.weight']
  with pytest.raises(ValueError, match='up_proj'):
    hf_llama.params_from_hf_weights(broken, m)
  extra = dict(weights, **{'model.embeds.0.weight': np.zeros((8, 32), np.float32)})
  with pytest.raises(ValueError, match='embeds'):
    hf_llama.params_from_hf_weights(extra, m)
  wrong = dict(weights, **{'model.norm.weight': np.zeros((31,), np.float32)})
  with pytest.raises(ValueError, match='shape'):
    hf_llama.params_from_hf_weights(wrong, m)


def test_tied_embeddings():
  model = _random_llama(3, tie_word_embeddings=True)
  weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  weights.pop('lm_head.weight', None)
  hf = json.loads(model.config.to_json_string())
  m = hf_llama.model_fields_from_hf_config(hf)
  params = hf_llama.params_from_hf_weights(weights, m, tie_word_embeddings=True)
  np.testing.assert_array_equal(params['lm_head']['kernel'], params['embed']['embedding'].T)


def test_hf_round_trip_of_weights_is_exact(llama_folder):
  folder, _ = llama_folder
  m = hf_llama.model_fields_from_hf_config(hf_files.read_hf_config(folder))
  weights = hf_files.read_hf_weights(folder)
  back = hf_llama.hf_weights_from_params(hf_llama.params_from_hf_weights(weights, m), m)
  assert sorted(back) == sorted(weights)
  for k in weights:
    np.testing.assert_array_equal(back[k], weights[k])


# ------------------------------------------------------------------ through the bipe_jax model

import dataclasses  # pylint: disable=g-import-not-at-top,g-bad-import-order
import functools  # pylint: disable=g-import-not-at-top,g-bad-import-order
import subprocess  # pylint: disable=g-import-not-at-top,g-bad-import-order

import flax.linen as nn  # pylint: disable=g-import-not-at-top,g-bad-import-order
import jax  # pylint: disable=g-import-not-at-top,g-bad-import-order
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,g-bad-import-order

from bipe_jax import config as config_lib  # pylint: disable=g-import-not-at-top
from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
from bipe_jax.interop import convert  # pylint: disable=g-import-not-at-top

ROOT = fixtures.ROOT


@functools.lru_cache(maxsize=None)
def _jitted_apply(model_config):
  model = model_lib.Transformer(dataclasses.replace(model_config, attention_impl='dense'))
  return jax.jit(lambda params, ids: model.apply({'params': params}, ids))


def _our_logits(model_config, params, ids_BxT):
  return np.asarray(_jitted_apply(model_config)(params, jnp.asarray(ids_BxT, jnp.int32)))


def test_llama_logits_equal_pytorch(llama_folder):
  folder, model = llama_folder
  model_config, params = convert.load_hf(folder)
  assert model_config.position_encoding == 'rope' and model_config.kv_heads == 2
  ids = np.stack([_ids_with_segments(24, 1), _ids_with_segments(24, 2)])
  with torch.no_grad():
    expected = model(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(_our_logits(model_config, params, ids), expected, atol=1e-4,
                             rtol=0)


@pytest.mark.parametrize('rope_parameters', [
    {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 5000.0},
    {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 16,
     'rope_theta': 10000.0}])
def test_rope_scaling_maps_to_equal_logits(tmp_path, rope_parameters):
  torch.manual_seed(0)
  config = _tiny_llama_config(num_hidden_layers=1, rope_parameters=rope_parameters)
  reference = transformers.LlamaForCausalLM(config).eval()
  with torch.no_grad():
    for p in reference.parameters():
      p.mul_(3.0)
  reference.save_pretrained(str(tmp_path))
  model_config, params = convert.load_hf(str(tmp_path))
  assert model_config.rope_scaling == rope_parameters['rope_type']
  assert model_config.rope_base == rope_parameters['rope_theta']
  ids = (np.arange(48) * 7 % VOCAB)[None]  # longer than yarn's original length 16
  with torch.no_grad():
    expected = reference(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(_our_logits(model_config, params, ids), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize('rpe_type', ['bipe_rope', 'bipe_alibi', 'alibi'])
def test_official_bipe_folder_matches_official_forward(tmp_path, rpe_type):
  # 8 heads exercise a power-of-two slope set; train_scale 8 < segment lengths -> clamping.
  hf, weights = _bipe_folder(tmp_path, rpe_type, train_scale=8, num_heads=8, kv_heads=8)
  model_config, params = convert.load_hf(str(tmp_path))
  assert model_config.position_encoding == rpe_type
  assert model_config.separator_ids == SEPARATORS and model_config.max_intra == 8
  ids = _ids_with_segments(30, 3)
  ids[2:14] = 100 + np.arange(12)  # a 12-token segment: intra positions past the table
  ours = _our_logits(model_config, params, ids[None])[0]
  expected = numpy_official_forward(weights, hf, ids)
  np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=1e-4)
  if rpe_type in OFFICIAL_BIPE_TYPES:  # the intra table really feeds the model
    zeroed = dict(params, intra_embed={'embedding': np.zeros_like(
        params['intra_embed']['embedding'])})
    assert np.abs(_our_logits(model_config, zeroed, ids[None])[0] - ours).max() > 1e-2


def test_official_bipe_rope_matches_transformers_with_bilevel_inputs(tmp_path):
  """BiPE-RoPE = HF Llama fed embed + intra table as inputs_embeds and inter ids as positions."""
  hf, weights = _bipe_folder(tmp_path, 'bipe_rope', train_scale=8, kv_heads=2)
  model_config, params = convert.load_hf(str(tmp_path))
  ids = _ids_with_segments(28, 4)
  intra, inter = _official_bilevel_ids(ids, 8)
  config = transformers.LlamaConfig(**{k: v for k, v in hf.items()
                                       if k not in ('rpe_type', 'train_scale', 'log_scale')})
  reference = transformers.LlamaForCausalLM(config).eval()
  reference.load_state_dict({k: torch.tensor(v) for k, v in weights.items()
                             if k != 'model.embeds.0.weight'})
  embeds = (weights['model.embed_tokens.weight'][ids] + weights['model.embeds.0.weight'][intra])
  with torch.no_grad():
    expected = reference(inputs_embeds=torch.tensor(embeds[None]),
                         position_ids=torch.tensor(inter[None])).logits[0].numpy()
  np.testing.assert_allclose(_our_logits(model_config, params, ids[None])[0], expected,
                             atol=1e-4, rtol=0)


def _random_rope_model():
  fields = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                ffn_size=48, position_encoding='rope', max_position=64, separators='ids',
                separator_ids=SEPARATORS, rms_eps=1e-5, attention_impl='dense')
  model_config = config_lib.model_config_from_dict(fields)
  model = model_lib.Transformer(model_config)
  shapes = nn.meta.unbox(jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32)))['params'])
  rng = np.random.default_rng(0)  # random weights of the model's shapes, norms around 1
  params = jax.tree.map(lambda s: (0.2 * rng.standard_normal(s.shape) if len(s.shape) >= 2
                                   else rng.uniform(0.5, 1.5, s.shape)).astype(np.float32),
                        shapes)
  return model_config, params


def test_ours_to_llama_to_ours_is_exact_and_runs_in_transformers(tmp_path):
  model_config, params = _random_rope_model()
  fields = dataclasses.asdict(model_config)
  hf = hf_llama.hf_config_from_model_fields(fields)
  hf_files.write_hf_folder(str(tmp_path), hf, hf_llama.hf_weights_from_params(params, fields))
  back_config, back = convert.load_hf(str(tmp_path))
  for path_and_leaf, leaf in zip(jax.tree_util.tree_leaves_with_path(params),
                                 jax.tree.leaves(back)):
    np.testing.assert_array_equal(path_and_leaf[1], leaf, err_msg=str(path_and_leaf[0]))
  assert jax.tree.structure(params) == jax.tree.structure(back)
  for field in ('vocab_size', 'hidden_size', 'num_layers', 'num_heads', 'kv_heads', 'head_size',
                'ffn_size', 'rms_eps', 'rope_base', 'position_encoding', 'max_position'):
    assert getattr(back_config, field) == getattr(model_config, field), field
  # The exported folder is a standard LlamaForCausalLM with the same logits.
  reference = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path)).eval()
  ids = _ids_with_segments(20, 5)[None]
  with torch.no_grad():
    expected = reference(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(_our_logits(model_config, params, ids), expected, atol=1e-4, rtol=0)


def test_export_rejects_what_llama_cannot_express():
  fields = dataclasses.asdict(config_lib.ModelConfig(position_encoding='rope', separators='ids',
                                                     separator_ids=SEPARATORS))
  with pytest.raises(ValueError, match='position_encoding'):
    hf_llama.hf_config_from_model_fields(dict(fields, position_encoding='kerple'))
  with pytest.raises(ValueError, match='separator_ids is empty'):
    hf_llama.hf_config_from_model_fields(dict(fields, position_encoding='bipe_rope',
                                              separator_ids=()))
  with pytest.raises(ValueError, match='restart_at_documents'):
    hf_llama.hf_config_from_model_fields(dict(fields, restart_at_documents=True))


@pytest.mark.slow
def test_convert_cli_round_trip_through_a_workdir(llama_folder, tmp_path):
  """HF folder -> workdir (CLI) -> restored by the evaluation loader -> HF folder, exact."""
  folder, model = llama_folder
  workdir, back = str(tmp_path / 'workdir'), str(tmp_path / 'back')
  os.makedirs(back)
  with open(os.path.join(back, 'stale.txt'), 'w', encoding='utf-8') as f:
    f.write('an older export')  # replaced only because --overwrite is given
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  for src, dst, extra in ((folder, workdir, []), (workdir, back, ['--overwrite'])):
    proc = forkserver.run([sys.executable, '-m', 'bipe_jax.convert', '--from', src, '--to', dst,
                           *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
  assert not os.path.exists(os.path.join(back, 'stale.txt'))
  assert os.path.isfile(os.path.join(workdir, 'config.py'))
  from bipe_jax.runs import restore as runs  # pylint: disable=g-import-not-at-top
  run = runs.load_run(workdir, attention_impl='dense')
  assert run.step == 0 and run.model_config.position_encoding == 'rope'
  ids = _ids_with_segments(16, 6)[None]
  with torch.no_grad():
    expected = model(torch.tensor(ids)).logits.numpy()
  with run.context():
    got = np.asarray(jax.jit(run.apply_fn())(run.params, jnp.asarray(ids)))
  np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
  original, exported = hf_files.read_hf_weights(folder), hf_files.read_hf_weights(back)
  assert sorted(original) == sorted(exported)
  for k in original:
    np.testing.assert_array_equal(original[k], exported[k], err_msg=k)


def test_convert_cli_errors(tmp_path):
  assert convert.main(['--from', str(tmp_path / 'missing'), '--to', str(tmp_path / 'x')]) == 2
  (tmp_path / 'config.json').write_text('{"foo": 1}')
  with pytest.raises(ValueError, match='neither'):
    convert.detect_direction(str(tmp_path))


def test_convert_cli_usage_errors_are_one_line(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    convert.main(['--from', str(tmp_path)])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and err.startswith('error: the following arguments are required: --to')
  (tmp_path / 'file').write_text('')
  assert convert.main(['--from', str(tmp_path), '--to', str(tmp_path / 'file')]) == 2
  assert capsys.readouterr().err == f"error: --to '{tmp_path / 'file'}' is a file, not a directory\n"
