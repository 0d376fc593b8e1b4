"""The Transformer: every scheme builds, trains, is causal, blockwise == dense, decode == full
forward; parameter tree, GQA, RoPE invariances, documents, padding, dtypes, preset sizes."""

import dataclasses
import importlib

import chex
import flax.linen as nn
import jax
from jax import ad_checkpoint
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bipe_jax import config as config_lib
from bipe_jax.kernels import cpu as cpu_kernels
from bipe_jax import model as model_lib
from bipe_jax import positions as positions_lib
from bipe_jax.config import ModelConfig
from bipe_jax.model import Transformer
from bipe_jax.schemes import SCHEME_NAMES

B, T, V = 2, 24, 48
SEP, BOS, PAD = (3, 5), 1, 0

TINY = ModelConfig(vocab_size=V, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                   ffn_size=64, max_intra=16, max_position=32, train_length=16,
                   separator_ids=SEP, bos_id=BOS, block_size=8, attention_impl='blockwise',
                   fire_hidden=8, dape_hidden=8, t5_buckets=8, t5_max_distance=16)


def _cfg(name, **kw):
  return config_lib.validate_model_config(
      dataclasses.replace(TINY, position_encoding=name, **kw))


def _tokens(seed=0, b=B, t=T):
  """Random ids in [6, V) with separators (ids 3, 5) about every 4 tokens."""
  rng = np.random.default_rng(seed)
  tok = rng.integers(6, V, size=(b, t))
  seps = rng.random((b, t)) < 0.25
  tok[seps] = rng.choice(SEP, size=int(seps.sum()))
  return jnp.asarray(tok, jnp.int32)


def _fill(path, shape):
  """Deterministic stand-in for the initialisers (no RNG compile: jitting the real init of every
  scheme costs most of the test budget on CPU; `test_real_init_*` covers the real one)."""
  name = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)][-1]
  rng = np.random.default_rng(abs(hash(jax.tree_util.keystr(path))) % 2**32)
  if name == 'scale':
    return jnp.ones(shape, jnp.float32)
  if name == 'c':
    return jnp.full(shape, 0.1, jnp.float32)
  if name == 'L_multiplier':
    return jnp.ones(shape, jnp.float32)
  if name in ('p', 'a'):
    return jnp.asarray(rng.uniform(0.2, 1.0, shape), jnp.float32)
  std = 0.3 if name in ('w_in', 'w_out', 'b_in', 'b_out', 'rel_embedding') else 0.1
  return jnp.asarray(rng.normal(size=shape) * std, jnp.float32)


def _variables(model, tokens, decode=False):
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens, decode=decode))
  params = jax.tree_util.tree_map_with_path(lambda p, s: _fill(p, s.shape), shapes['params'])
  out = {'params': params}
  if decode:
    out['cache'] = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes['cache'])
  return out


def _forward(cfg):
  model = Transformer(cfg)
  return jax.jit(lambda params, tok: model.apply({'params': params}, tok))


def _decode_fns(cfg):
  model = Transformer(cfg)
  step = lambda params, cache, tok: model.apply({'params': params, 'cache': cache}, tok,
                                                decode=True, mutable=['cache'])
  return jax.jit(step)


def _decode_all(cfg, params, tokens, prompt_len):
  cache = _variables(Transformer(cfg), tokens, decode=True)['cache']
  step = _decode_fns(cfg)
  logits, mut = step(params, cache, tokens[:, :prompt_len])
  outs = [logits]
  for i in range(prompt_len, tokens.shape[1]):
    logits, mut = step(params, mut['cache'], tokens[:, i:i + 1])
    outs.append(logits)
  return jnp.concatenate(outs, axis=1), mut['cache']


def _train_losses(cfg, params, tokens, steps=4):
  """(losses, last gradients, the logits [B, T, V] of the first step's forward: the model's
  full forward at `params`) of `steps` Adam steps on the repeated batch. The loss scores
  logits[:, :-1] against tokens[:, 1:] (causal: the last token changes no earlier logit), so
  one compiled program gives both the training run and the full forward."""
  model = Transformer(cfg)
  opt = optax.adam(3e-2)

  def loss_fn(p):
    logits = model.apply({'params': p}, tokens)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:])
    return nll.mean(), logits

  @jax.jit
  def step(p, s):
    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
    updates, s = opt.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss, grads, logits

  state, losses, first_logits = opt.init(params), [], None
  for _ in range(steps):
    params, state, loss, grads, logits = step(params, state)
    first_logits = logits if first_logits is None else first_logits
    chex.assert_tree_all_finite(grads)
    losses.append(float(loss))
  return losses, grads, first_logits


@pytest.mark.parametrize('name', SCHEME_NAMES)
def test_every_scheme(name):
  """Builds, blockwise == dense, causal, decode == full forward, loss goes down."""
  cfg = _cfg(name)
  dense_cfg = dataclasses.replace(cfg, attention_impl='dense')
  tokens = _tokens(0)
  params = _variables(Transformer(cfg), tokens)['params']
  fwd = _forward(cfg)
  logits = fwd(params, tokens)
  chex.assert_shape(logits, (B, T, V))
  chex.assert_type(logits, jnp.float32)
  chex.assert_tree_all_finite(logits)

  # Blockwise (3 blocks of 8) equals dense (the dense forward of the training run below).
  losses, grads, dense_logits = _train_losses(dense_cfg, params, tokens)
  np.testing.assert_allclose(logits, dense_logits, atol=1e-5, rtol=1e-5)

  # Causality: changing tokens after t leaves logits up to t unchanged (same compiled fn).
  t0 = 13
  changed = tokens.at[:, t0 + 1:].set(_tokens(1)[:, t0 + 1:])
  changed_logits = fwd(params, changed)
  np.testing.assert_allclose(changed_logits[:, :t0 + 1], logits[:, :t0 + 1], atol=1e-5)
  assert float(jnp.max(jnp.abs(changed_logits[:, t0 + 1:] - logits[:, t0 + 1:]))) > 1e-4

  # KV-cache decode: prefill 10 tokens then one at a time == full forward.
  decode_cfg = cfg if name in ('dapev2_kerple', 'bipe_alibi', 'fire') else dense_cfg
  decoded, cache = _decode_all(decode_cfg, params, tokens, prompt_len=10)
  np.testing.assert_allclose(decoded, logits, atol=1e-5, rtol=1e-5)
  assert int(cache['index']) == T

  # Training: the loss on a repeated tiny batch goes down with Adam.
  assert losses[-1] < losses[0] - 0.1, losses
  moved = [float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads)]
  assert all(moved), 'every parameter must receive a gradient'


def test_param_tree_matches_design():
  cfg = _cfg('bipe_dape_kerple', num_layers=2)
  shapes = nn.meta.unbox(jax.eval_shape(
      lambda: Transformer(cfg).init(jax.random.PRNGKey(0), _tokens())))['params']
  flat = {jax.tree_util.keystr(k): v.shape for k, v in
          jax.tree_util.tree_flatten_with_path(shapes)[0]}
  d, h, g, dh, f = 32, 4, 2, 8, 64
  expect = {
      "['embed']['embedding']": (V, d), "['intra_embed']['embedding']": (16, d),
      "['final_norm']['scale']": (d,), "['lm_head']['kernel']": (d, V)}
  for i in range(2):
    p = f"['layer_{i}']"
    expect.update({
        p + "['attention_norm']['scale']": (d,), p + "['mlp_norm']['scale']": (d,),
        p + "['attention']['query']['kernel']": (d, h, dh),
        p + "['attention']['key']['kernel']": (d, g, dh),
        p + "['attention']['value']['kernel']": (d, g, dh),
        p + "['attention']['out']['kernel']": (h, dh, d),
        p + "['attention']['kerple']['p']": (h,), p + "['attention']['kerple']['a']": (h,),
        p + "['mlp']['gate']['kernel']": (d, f), p + "['mlp']['up']['kernel']": (d, f),
        p + "['mlp']['down']['kernel']": (f, d)})
  for key, shape in expect.items():
    assert flat[key] == shape, key
  dape_keys = [k for k in flat if "['dape']" in k]
  assert len(dape_keys) == 2 * 4  # w_in, b_in, w_out, b_out per layer
  assert not any('abs_embed' in k for k in flat)
  learned = jax.eval_shape(lambda: Transformer(_cfg('learned')).init(
      jax.random.PRNGKey(0), _tokens()))['params']
  assert learned['abs_embed']['embedding'].shape == (32, d)
  assert 'intra_embed' not in learned


def test_logical_partitioning_on_every_param():
  cfg = _cfg('bipe_rope')
  with jax.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))):  # names need a mesh
    boxed = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.PRNGKey(0),
                                                         _tokens()))['params']
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
  names = nn.get_partition_spec(boxed)
  assert tuple(names['embed']['embedding']) == ('vocab', 'embed')
  assert tuple(names['layer_0']['attention']['query']['kernel']) == ('embed', 'heads',
                                                                     'head_dim')
  assert tuple(names['lm_head']['kernel']) == ('embed', 'vocab')


def test_real_init_and_cache_init_then_decode():
  """model.init (real initialisers) and the documented cache recipe, on bipe_dape_kerple."""
  cfg = _cfg('bipe_dape_kerple', attention_impl='dense')
  model = Transformer(cfg)
  tokens = _tokens(2)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)
  params = nn.meta.unbox(variables['params'])
  std = float(jnp.std(params['layer_0']['attention']['query']['kernel']))
  assert 0.01 < std < 0.03  # normal(0.02)
  kerple_p = params['layer_0']['attention']['kerple']['p']
  assert bool(jnp.all((kerple_p >= 0) & (kerple_p <= 2)))
  # Only the cache is returned, so XLA drops the parameter initialisers (fast to compile).
  cache = jax.jit(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((B, T), jnp.int32),
                                     decode=True)['cache'])()
  assert cache['layer_0']['attention']['cached_key'].shape == (B, 2, T, 8)
  assert cache['tokens'].shape == (B, T) and int(cache['index']) == 0
  full = _forward(cfg)(params, tokens)
  step = _decode_fns(cfg)
  logits, mut = step(params, cache, tokens[:, :T - 1])
  logits2, mut = step(params, mut['cache'], tokens[:, T - 1:])
  np.testing.assert_allclose(jnp.concatenate([logits, logits2], 1), full, atol=1e-5)
  # Running bilevel state = the last token's positions.
  pos = Transformer(cfg).apply({'params': params}, tokens,
                               method=Transformer.compute_positions)
  c = mut['cache']
  np.testing.assert_array_equal(c['last_inter'], pos.inter[:, -1])
  np.testing.assert_array_equal(c['last_intra'], pos.intra[:, -1])
  np.testing.assert_array_equal(c['last_is_separator'], np.isin(tokens[:, -1], SEP))


def test_decode_continues_segments_across_calls():
  """A separator at the end of the prompt: the next decoded token starts a new segment."""
  cfg = _cfg('bipe_rope', attention_impl='dense')
  tokens = _tokens(3).at[:, 9].set(SEP[0])
  params = _variables(Transformer(cfg), tokens)['params']
  decoded, cache = _decode_all(cfg, params, tokens, prompt_len=10)
  np.testing.assert_allclose(decoded, _forward(cfg)(params, tokens), atol=1e-5)
  pos = positions_lib.bilevel_positions(tokens, positions_lib.separator_table(V, SEP))
  np.testing.assert_array_equal(cache['pos_inter'], pos.inter)
  np.testing.assert_array_equal(cache['pos_intra'], pos.intra)
  assert bool(jnp.all(cache['pos_intra'][:, 10] == 0))


def test_gqa_equals_mha_with_repeated_kv_weights():
  gqa_cfg = _cfg('bipe_alibi', num_layers=2)
  mha_cfg = dataclasses.replace(gqa_cfg, num_kv_heads=4)
  tokens = _tokens(4)
  params = _variables(Transformer(gqa_cfg), tokens)['params']
  mha = jax.tree.map(lambda x: x, params)
  for i in range(2):
    att = dict(params[f'layer_{i}']['attention'])
    for name in ('key', 'value'):
      att[name] = {'kernel': jnp.repeat(att[name]['kernel'], 2, axis=1)}
    mha[f'layer_{i}'] = dict(params[f'layer_{i}'], attention=att)
  np.testing.assert_allclose(_forward(gqa_cfg)(params, tokens),
                             _forward(mha_cfg)(mha, tokens), atol=1e-5)


def _apply_with_positions(cfg, params, tokens, pos):
  model = Transformer(cfg)
  return jax.jit(lambda p, t, ps: model.apply({'params': p}, t, positions=ps))(params, tokens,
                                                                               pos)


def test_rope_family_shift_invariance():
  tokens = _tokens(5)
  table = positions_lib.separator_table(V, SEP)
  pos = positions_lib.bilevel_positions(tokens, table)
  # bipe_rope: shifting every inter id by a constant leaves the logits unchanged.
  cfg = _cfg('bipe_rope', attention_impl='dense')
  params = _variables(Transformer(cfg), tokens)['params']
  base = _apply_with_positions(cfg, params, tokens, pos)
  np.testing.assert_allclose(base, _forward(cfg)(params, tokens), atol=1e-6)
  shifted = _apply_with_positions(cfg, params, tokens, pos.replace(inter=pos.inter + 57))
  np.testing.assert_allclose(shifted, base, atol=1e-4)
  changed = _apply_with_positions(cfg, params, tokens, pos.replace(intra=pos.intra + 1))
  assert float(jnp.max(jnp.abs(changed - base))) > 1e-4  # intra is absolute: it matters
  # rope: shifting token positions by a constant leaves the logits unchanged.
  cfg = _cfg('rope', attention_impl='dense')
  params = _variables(Transformer(cfg), tokens)['params']
  base = _apply_with_positions(cfg, params, tokens, pos)
  shifted = _apply_with_positions(cfg, params, tokens, pos.replace(token=pos.token + 100))
  np.testing.assert_allclose(shifted, base, atol=1e-4)


@pytest.mark.parametrize('name', ['rope', 'bipe_rope'])
def test_rope_tables_read_from_host_equal_computed_ones(name):
  """On the cpu kernels path, streams the model computes itself (documents restarting,
  padding) take the RoPE table lookup; the same streams given as `positions` take the computed
  sin / cos: same logits. The portable path computes them in the program."""
  cfg = _cfg(name, attention_impl='dense', restart_at_documents=True, pad_id=PAD,
             kernels='cpu')
  tokens = _tokens(8).at[:, 0].set(BOS).at[:, 9].set(BOS).at[1, 15:18].set(PAD)
  params = _variables(Transformer(cfg), tokens)['params']
  pos = Transformer(cfg).apply({'params': params}, tokens, method='compute_positions')
  computed = _apply_with_positions(cfg, params, tokens, pos)
  looked_up = _forward(cfg)(params, tokens)
  chex.assert_shape(looked_up, (B, T, V))
  np.testing.assert_allclose(looked_up, computed, atol=2e-5)
  program = lambda c: jax.jit(lambda p, t: Transformer(c).apply({'params': p}, t)).lower(
      params, tokens).as_text()
  hlo = program(cfg)
  assert 'sine' not in hlo and 'cosine' not in hlo  # no sin / cos left in the program
  portable = program(dataclasses.replace(cfg, kernels='portable'))
  assert 'sine' in portable and 'cosine' in portable


def test_documents_restart_and_mask():
  """restart_at_documents + mask_across_documents: the second document's logits do not depend
  on the first document at all."""
  cfg = _cfg('bipe_kerple', restart_at_documents=True, mask_across_documents=True)
  tokens = _tokens(6).at[:, 0].set(BOS).at[:, 11].set(BOS)
  other = tokens.at[:, 1:11].set(_tokens(7)[:, 1:11])
  params = _variables(Transformer(cfg), tokens)['params']
  fwd = _forward(cfg)
  a, b = fwd(params, tokens), fwd(params, other)
  np.testing.assert_allclose(a[:, 11:], b[:, 11:], atol=1e-5)
  assert float(jnp.max(jnp.abs(a[:, :11] - b[:, :11]))) > 1e-4
  # Second document alone (shifted to the row start) gives the same logits.
  alone = fwd(params, jnp.concatenate([tokens[:, 11:], tokens[:, :11]], axis=1))
  np.testing.assert_allclose(alone[:, :T - 11], a[:, 11:], atol=1e-5)


@pytest.mark.parametrize('name', ['rope', 'bipe_alibi'])
def test_padding_is_invisible(name):
  cfg = _cfg(name, pad_id=PAD, attention_impl='dense')
  tokens = _tokens(8, t=20)
  padded = jnp.concatenate([tokens[:, :7], jnp.full((B, 4), PAD, jnp.int32), tokens[:, 7:]], 1)
  params = _variables(Transformer(cfg), padded)['params']
  fwd = _forward(cfg)
  a = fwd(params, jnp.concatenate([tokens, jnp.full((B, 4), PAD, jnp.int32)], 1))
  b = fwd(params, padded)
  np.testing.assert_allclose(b[:, :7], a[:, :7], atol=1e-5)
  np.testing.assert_allclose(b[:, 11:], a[:, 7:20], atol=1e-5)


def test_bfloat16_compute_and_remat():
  tokens = _tokens(9)
  cfg = _cfg('dape_kerple', attention_impl='dense')
  params = _variables(Transformer(cfg), tokens)['params']
  ref = _forward(cfg)(params, tokens)
  bf16 = _forward(dataclasses.replace(cfg, dtype='bfloat16'))(params, tokens)
  chex.assert_type(bf16, jnp.float32)
  np.testing.assert_allclose(bf16, ref, atol=0.1)
  remat = dataclasses.replace(cfg, remat=True)
  np.testing.assert_allclose(_forward(remat)(params, tokens), ref, atol=1e-6)
  loss = lambda c: lambda p: Transformer(c).apply({'params': p}, tokens).std()
  g1, g2 = jax.jit(jax.grad(loss(cfg)))(params), jax.jit(jax.grad(loss(remat)))(params)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_no_jit_equals_jit():
  cfg = _cfg('alibi', attention_impl='dense')
  tokens = _tokens(10, t=8)
  params = _variables(Transformer(cfg), tokens)['params']
  with jax.disable_jit():
    eager = Transformer(cfg).apply({'params': params}, tokens)
  np.testing.assert_allclose(eager, _forward(cfg)(params, tokens), atol=1e-5)


@pytest.mark.parametrize('preset', ['rope_151m', 'bipe_rope_151m', 'bipe_alibi_151m',
                                    'alibi_151m'])
def test_151m_presets_parameter_count(preset):
  config = importlib.import_module(f'configs.{preset}').get_config()
  n = model_lib.count_params(config_lib.model_config_from_dict(config.model,
                                                                 require_separators=False))
  assert 150e6 <= n <= 165e6, n


def test_blockwise_model_gradients_equal_dense():
  """Parameter gradients through the whole model, blockwise (DAPE V2 halo, 3 ragged blocks)
  vs dense attention."""
  cfg = _cfg('dapev2_kerple', block_size=10)
  tokens = _tokens(11)
  params = _variables(Transformer(cfg), tokens)['params']

  def grads(c):
    loss = lambda p: jnp.mean(Transformer(c).apply({'params': p}, tokens)[:, :, 7] ** 2)
    return jax.jit(jax.grad(loss))(params)

  g_block = grads(cfg)
  g_dense = grads(dataclasses.replace(cfg, attention_impl='dense'))
  for path, gb in jax.tree_util.tree_flatten_with_path(g_block)[0]:
    gd = dict(jax.tree_util.tree_flatten_with_path(g_dense)[0])[path]
    np.testing.assert_allclose(gb, gd, atol=1e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_swiglu_keeps_only_its_inputs_for_the_backward_pass(capsys):
  """The cpu kernels path's swiglu (bipe_jax/kernels/cpu.py): values, gradients, forward mode
  equal silu(gate) * up; the backward pass keeps gate and up and recomputes silu (the plain
  expression keeps three more arrays)."""
  kg, ku, kc = jax.random.split(jax.random.PRNGKey(4), 3)
  gate, up, ct = (jax.random.normal(k, (3, 5, 7)) for k in (kg, ku, kc))
  plain = lambda g, u: nn.silu(g) * u
  np.testing.assert_allclose(cpu_kernels.swiglu(gate, up), plain(gate, up), rtol=1e-6)
  loss = lambda f: (lambda g, u: jnp.sum(f(g, u) * ct))
  for got, want in zip(jax.jit(jax.grad(loss(cpu_kernels.swiglu), (0, 1)))(gate, up),
                       jax.grad(loss(plain), (0, 1))(gate, up)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jax.jvp(cpu_kernels.swiglu, (gate, up), (ct, gate))[1],
                             jax.jvp(plain, (gate, up), (ct, gate))[1], rtol=1e-5, atol=1e-6)
  residuals = {}
  for name, f in (('ours', cpu_kernels.swiglu), ('plain', plain)):
    ad_checkpoint.print_saved_residuals(loss(f), gate, up)
    residuals[name] = capsys.readouterr().out.strip().splitlines()
  kept = lambda name: [line for line in residuals[name] if 'from a constant' not in line]  # ct
  assert [line.split(' from ')[1] for line in kept('ours')] == ['the argument g',
                                                               'the argument u']
  assert sum('silu' in line for line in kept('plain')) == 3, residuals['plain']
