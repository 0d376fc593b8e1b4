"""One decoder layer's training cost on a TPU slice, by XLA's TPU cost model, per encoding and
attention path, beside a stock layer of the same shape (the anchor row).

    JAX_PLATFORMS=cpu nice -n 5 python -m benchmarks.tpu_layer_cost            # paper shape
    ... --encodings bipe_rope,rope --impls pallas --check_step bipe_rope:pallas
    ... --encodings rope,bipe_rope,bipe_alibi --impls pallas --block_sizes 128,256,512,1024

Each row compiles, for `--topology` (libtpu, ahead of time: no TPU needed), the forward and
backward of ONE layer: `jax.grad` of sum(layer(x) * g) with respect to the layer's parameters
and its input x [B, T, D] (g: a given cotangent), with the step's remat policy, the step's
parameter shardings (the gradient reduced to them, as the step reduces it) and its batch
sharding. The layer is the project's `model.DecoderLayer` of the preset's config (default
configs/paper_151m_tpu.py: bf16, remat save_projections, 32 x 1024 tokens per chip on v5e:2x4),
with `model.attention_impl` set per row; its inputs are what the Transformer hands every layer
(the positions and, for rotary schemes, the RoPE tables made once per forward pass). Blockwise
attention's block loops are unrolled (bipe_jax/loop_unroll.py) so that each block is costed.

  ms    `optimal_seconds` of the compiled program (hlo_stats.optimal_seconds), per chip
  MFU   the layer's model FLOPs (training/flops.py: 3 x forward, causal attention halved; per
        chip) over ms and the chip's published peak (training/flops.py)

The anchor is a stock layer written here, not the project's: RMSNorm, RoPE (rotate-half,
tables computed in the layer), JAX's own splash attention
(jax.experimental.pallas.ops.tpu.splash_attention, causal, blocks `--splash_block`, q / k / v in
its sequence-minor layout), SwiGLU, the same remat policy (the projections' outputs saved).
Splash gives its pallas_calls no `pl.CostEstimate`, and XLA's cost model prices a custom call
without one as nothing; the anchor attaches the estimate the project's kernels use
(bipe_jax/attention/pallas/cost.py: FLOPs of the visible causal tiles, bytes of the blocks the
pipeline copies) at splash's block sizes, so both sides are priced by one rule.

`--block_sizes 128,256,...` costs each Pallas row once per tile size (model.block_size, which
attention/op.py hands the kernels as block_q and block_k; rows 'pallas, block N') and adds a
table of ms per layer by block size; without it the preset's block_size (or `--block_size`).

`--check_step ENC:IMPL` also predicts that row the way train/compile.py does (the 1- and
2-layer steps, compile/step_cost.py: per layer = c(2) - c(1)) and reports the two figures and
their ratio. All figures are estimates of XLA's TPU cost model, not measurements.
"""

import argparse
import contextlib
import functools
import math
import os
import sys
import time
import types
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top,wrong-import-position

from benchmarks import common  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax import loop_unroll  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax import remat as remat_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.attention import support  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.compile import aot  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.compile import hlo_stats  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.compile import step_cost  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.compile import topologies  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.state import mesh as mesh_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.training import flops as flops_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bipe_jax.training import setup as setup_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

ENCODINGS = ('rope', 'bipe_rope', 'alibi', 'bipe_alibi', 'kerple', 'fire', 'dape_kerple', 'fox',
             'cope')
# The TPU paths (cudnn and pallas_gpu are GPU kernels; 'auto' is one of these).
TPU_IMPLS = ('pallas', 'blockwise', 'dense', 'fused')
ANCHOR = 'stock (splash)'
# The measuring order when time is short: the rows that decide the issue first.
FIRST = (('bipe_rope', 'pallas'), ('rope', 'pallas'), ('bipe_alibi', 'pallas'),
         ('kerple', 'pallas'), ('dape_kerple', 'pallas'), ('dape_kerple', 'blockwise'),
         ('fox', 'pallas'))


def preset_config(config_path: str, encoding: str):
  """The preset of `config_path` (a configs/*.py file taking a preset name) for `encoding`;
  an encoding without its own preset is the 'alibi' preset with model.position_encoding set
  (as `:alibi --config.model.position_encoding=ENC`)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location('layer_cost_preset', os.path.join(ROOT,
                                                                                 config_path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  try:
    return module.get_config(encoding)
  except ValueError:
    config = module.get_config('alibi')
    config.model.position_encoding = encoding
    return config


def shaped(config, args):
  """`config` with the shape flags applied (0 = the preset's), one layer, unrolled."""
  c = step_cost.costing_config(config, 1)
  m, t = c.model, c.train
  for flag, section, name in (('width', m, 'hidden_size'), ('heads', m, 'num_heads'),
                              ('ffn', m, 'ffn_size'), ('vocab', m, 'vocab_size'),
                              ('block_size', m, 'block_size')):
    if getattr(args, flag):
      setattr(section, name, int(getattr(args, flag)))
  if args.seq:
    c.data.seq_len = int(args.seq)
    m.max_intra = max(int(m.max_intra), int(args.seq))
    m.max_position = max(int(m.max_position), int(args.seq))
  if args.batch_per_chip:
    t.batch_size = int(args.batch_per_chip) * args.num_devices
  t.loss_chunk_tokens = min(int(t.loss_chunk_tokens), int(t.batch_size) * int(c.data.seq_len)
                            // args.num_devices)
  return c


def layer_model_flops(model_config, seq_len: int, tokens_per_chip: int) -> float:
  """Training model FLOPs of one layer per chip (training/flops.py: the 1-layer count less the
  0-layer one, i.e. less the unembedding)."""
  fields = {n: getattr(model_config, n) for n in (
      'hidden_size', 'num_heads', 'num_kv_heads', 'head_dim', 'ffn_size', 'vocab_size',
      'position_encoding', 'fire_hidden', 'dape_hidden', 'dapev2_kernel')
            if getattr(model_config, n, None) is not None}
  per_token = (flops_lib.train_flops_per_token({**fields, 'num_layers': 1}, seq_len)
               - flops_lib.train_flops_per_token({**fields, 'num_layers': 0}, seq_len))
  return per_token * tokens_per_chip


def _abstract(shape, dtype, sharding):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def project_layer(config, devices, with_update: bool = False):
  """(fn, args, model config, setup) of the project's layer costing program for `config`;
  `with_update`: the step's optimizer (its AdamW, clipping over these parameters only) also
  applies the gradient to the layer's parameters and optimizer state, as the step does."""
  resolved = aot.resolve(config, len(devices))
  mesh = aot._mesh(resolved.mesh, devices, 1)  # pylint: disable=protected-access
  setup = setup_lib.build(resolved, mesh)
  cfg = setup.model.config
  b, t, d = int(resolved.train.batch_size), setup.seq_len, cfg.hidden_size
  rows = mesh_lib.batch_sharding(mesh)
  x_sh = mesh_lib.batch_sharding(mesh, 3)
  param_sh = setup.shardings.params['layer_0']
  params = jax.tree.map(lambda a, s: _abstract(a.shape, a.dtype, s),
                        setup.abstract.params['layer_0'], param_sh)
  ints = lambda: _abstract((b, t), jnp.int32, rows)
  side = model_lib.Side(index=ints(), token=ints(), intra=ints(), inter=ints(),
                        document=ints(), valid=_abstract((b, t), jnp.bool_, rows),
                        paragraph=ints(), sentence=ints())
  q_side = side
  if cfg.scheme.rotary != 'none':  # the tables the Transformer makes once per forward pass
    cos, sin = jax.eval_shape(lambda s: model_lib.rotary_tables(cfg, s, t), side)
    table_sh = mesh_lib.batch_sharding(mesh, 4)
    q_side = side.replace(rope_cos=_abstract(cos.shape, cos.dtype, table_sh),
                          rope_sin=_abstract(sin.shape, sin.dtype, table_sh))
  layer = remat_lib.remat_layer(model_lib.DecoderLayer, cfg.remat, scanned=False)(cfg)
  x = _abstract((b, t, d), cfg.compute_dtype, x_sh)

  def loss(params, x, cotangent, q_side, k_side):
    out = layer.apply({'params': params}, x, q_side, k_side, jnp.zeros((), jnp.int32))
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32))

  if not with_update:
    fn = jax.jit(jax.grad(loss, argnums=(0, 1)), out_shardings=(param_sh, x_sh))
    return fn, (params, x, x, q_side, side), cfg, setup
  import optax  # pylint: disable=g-import-not-at-top
  tx = setup.tx
  with setup.context():
    opt_abstract = jax.eval_shape(tx.init, params)
  opt_sh = optax.tree_map_params(
      tx, lambda _, sharding: sharding, opt_abstract, param_sh,
      transform_non_params=lambda _: mesh_lib.replicated(mesh),
      is_leaf=lambda a: isinstance(a, NamedSharding))
  opt_state = jax.tree.map(lambda a, sh: _abstract(a.shape, a.dtype, sh), opt_abstract, opt_sh)

  def step(params, opt_state, x, cotangent, q_side, k_side):
    grads, dx = jax.grad(loss, argnums=(0, 1))(params, x, cotangent, q_side, k_side)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, dx

  fn = jax.jit(step, out_shardings=(param_sh, opt_sh, x_sh), donate_argnums=(0, 1))
  return fn, (params, opt_state, x, x, q_side, side), cfg, setup


# ---- the anchor: a stock layer with JAX's splash attention ---------------------------------


@contextlib.contextmanager
def splash_priced(num_heads: int, seq_len: int, head_dim: int, block: int, itemsize: int):
  """Splash's pallas_calls traced in this block carry the `pl.CostEstimate` of the project's
  kernels (attention/pallas/cost.py) for one batch row (vmap scales it by the rows). JAX's
  trace caches are cleared on entry and exit, so no trace crosses the block's edge."""
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # pylint: disable=g-import-not-at-top
  from bipe_jax.attention.pallas import cost  # pylint: disable=g-import-not-at-top
  shape = (1, num_heads, num_heads, seq_len, seq_len, head_dim, block, block, True, itemsize)
  forward = cost.forward_cost(*shape)
  dq, dkv = cost.backward_cost(*shape)

  def pallas_call(*a, **kw):
    name = kw.get('name') or ''
    if kw.get('cost_estimate') is None:
      kw['cost_estimate'] = dq if '_dq' in name else dkv if '_dkv' in name else forward
    return pl.pallas_call(*a, **kw)

  proxy = types.SimpleNamespace(**{k: getattr(pl, k) for k in dir(pl) if not k.startswith('__')})
  proxy.pallas_call = pallas_call
  saved, sk.pl = sk.pl, proxy
  jax.clear_caches()  # splash's inner jits would reuse traces made without the estimates
  try:
    yield
  finally:
    sk.pl = saved
    jax.clear_caches()


def _rms_norm(x, scale, eps=1e-6):
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (y * scale).astype(x.dtype)


def _rope(x_BxTxHxK, base: float = 10000.0):
  """Rotate-half RoPE at positions 0..T-1 (tables made here, float32)."""
  t, k = x_BxTxHxK.shape[1], x_BxTxHxK.shape[-1]
  inv = 1.0 / base ** (jnp.arange(0, k, 2, dtype=jnp.float32) / k)
  angles = jnp.arange(t, dtype=jnp.float32)[:, None] * inv[None, :]  # [T, K/2]
  cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
  x1, x2 = jnp.split(x_BxTxHxK.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x_BxTxHxK.dtype)


def splash_kernel(num_heads: int, seq_len: int, block: int):
  """JAX's splash attention, causal, [H, T, K] q / k / v per batch row (its logical interface),
  blocks of `block`, sequence-minor layout. Made outside the mesh context: its mask tables are
  arrays on the host."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm  # pylint: disable=g-import-not-at-top
  h = num_heads
  seq_minor = sk.QKVLayout.SEQ_MINOR
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                        block_q_dq=block, block_kv_dq=block, q_layout=seq_minor,
                        k_layout=seq_minor, v_layout=seq_minor)
  mask = sm.MultiHeadMask([sm.CausalMask((seq_len, seq_len)) for _ in range(h)])
  kernel = sk.make_splash_mha(mask=mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)
  return kernel


def anchor_layer(cfg, mesh, batch: int, seq_len: int, kernel):
  """(fn, args) of the stock layer's costing program (see the module docstring); `kernel`:
  `splash_kernel`'s."""
  from jax.ad_checkpoint import checkpoint_name  # pylint: disable=g-import-not-at-top
  d, h, k, f = cfg.hidden_size, cfg.num_heads, cfg.head_size, cfg.ffn_size
  dtype = cfg.compute_dtype
  rows = P(mesh_lib.BATCH_AXES)

  def attention(q, kk, v):  # [B, H, T, K] each, per shard
    return jax.vmap(kernel)(q, kk, v)

  sharded = jax.shard_map(attention, in_specs=(rows, rows, rows), out_specs=rows,
                          check_vma=False)
  proj = lambda x, w, eq, name: checkpoint_name(jnp.einsum(eq, x, w.astype(dtype)), name)

  def layer(p, x):
    y = _rms_norm(x, p['attention_norm'])
    q = _rope(proj(y, p['query'], 'btd,dhk->bthk', 'query')) * (k ** -0.5)
    kk = _rope(proj(y, p['key'], 'btd,dhk->bthk', 'key'))
    v = proj(y, p['value'], 'btd,dhk->bthk', 'value')
    heads = lambda a: a.transpose(0, 2, 1, 3)  # [B, H, T, K]: splash's logical interface
    o = sharded(heads(q), heads(kk), heads(v)).transpose(0, 2, 1, 3)
    x = x + proj(o, p['out'], 'bthk,hkd->btd', 'out')
    y = _rms_norm(x, p['mlp_norm'])
    hidden = jax.nn.silu(proj(y, p['gate'], 'btd,df->btf', 'gate')) * proj(
        y, p['up'], 'btd,df->btf', 'up')
    return x + proj(hidden, p['down'], 'btf,fd->btd', 'down')

  policy = (jax.checkpoint_policies.save_only_these_names(*remat_lib.PROJECTION_NAMES)
            if remat_lib.remat_name(cfg.remat) == 'save_projections' else None)
  if remat_lib.remat_name(cfg.remat) != 'none':
    layer = jax.checkpoint(layer, policy=policy, prevent_cse=True)

  shapes = {'attention_norm': ((d,), ('embed',)), 'mlp_norm': ((d,), ('embed',)),
            'query': ((d, h, k), ('embed', 'heads', 'head_dim')),
            'key': ((d, h, k), ('embed', 'heads', 'head_dim')),
            'value': ((d, h, k), ('embed', 'heads', 'head_dim')),
            'out': ((h, k, d), ('heads', 'head_dim', 'embed')),
            'gate': ((d, f), ('embed', 'mlp')), 'up': ((d, f), ('embed', 'mlp')),
            'down': ((f, d), ('mlp', 'embed'))}
  abstract = {n: jax.ShapeDtypeStruct(s, jnp.float32) for n, (s, _) in shapes.items()}
  param_sh = mesh_lib.logical_to_shardings({n: P(*a) for n, (_, a) in shapes.items()},
                                           abstract, mesh)
  params = jax.tree.map(lambda a, s: _abstract(a.shape, a.dtype, s), abstract, param_sh)
  x_sh = mesh_lib.batch_sharding(mesh, 3)
  x = _abstract((batch, seq_len, d), dtype, x_sh)

  def loss(p, x, cotangent):
    return jnp.sum(layer(p, x).astype(jnp.float32) * cotangent.astype(jnp.float32))

  fn = jax.jit(jax.grad(loss, argnums=(0, 1)), out_shardings=(param_sh, x_sh))
  return fn, (params, x, x)


# ---- rows -----------------------------------------------------------------------------------


def _compile(fn, args, name: str, model_flops: float):
  """aot's compile of `fn` (StepFigures) and how many ConcatBitcast custom calls it holds."""
  figures = aot._compile(fn, args, name, model_flops, keep_text=True)  # pylint: disable=protected-access
  text = figures.text.get('compiled', '')
  figures.text = {}
  return figures, len(hlo_stats._UNCOSTED.findall(text))  # pylint: disable=protected-access


def _row(encoding, impl, compiled, model_flops, peak, compile_seconds, **extra):
  figures, concat_bitcasts = compiled
  row = {'encoding': encoding, 'impl': impl, 'compile_seconds': round(compile_seconds, 1),
         'model_flops_per_chip': model_flops, 'concat_bitcasts': concat_bitcasts, **extra}
  if figures.out_of_memory:
    row['error'] = f'does not fit: {figures.out_of_memory[:160]}'
    return row
  seconds = figures.optimal_seconds
  row.update(ms=seconds * 1e3, xla_flops_per_chip=figures.flops, while_loops=figures.while_loops,
             temp_gib=figures.temp_bytes / 2 ** 30,
             mfu=(model_flops / seconds / peak) if seconds > 0 and peak else 0.0)
  return row


def cost_row(config, encoding: str, impl: str, devices, peak: float,
             with_update: bool = False, block: Optional[int] = None) -> dict:
  """The project's layer for (encoding, impl), costed alone (`project_layer`); `block`: the
  model.block_size of the row (None: the config's)."""
  start = time.monotonic()
  c = config.copy_and_resolve_references()
  c.model.attention_impl = impl
  if block is not None:
    c.model.block_size = int(block)
  label = impl if block is None else f'{impl}, block {block}'
  try:
    fn, args, cfg, setup = project_layer(c, devices, with_update)
    tokens = int(c.train.batch_size) * setup.seq_len // len(devices)
    flops = layer_model_flops(cfg, setup.seq_len, tokens)
    with setup.context(), loop_unroll.unrolled():
      figures = _compile(fn, args, f'{encoding}/{impl} layer', flops)
  except Exception as e:  # pylint: disable=broad-except (one error row, the sweep goes on)
    return {'encoding': encoding, 'impl': label, 'block': int(c.model.block_size),
            'error': ' '.join(str(e).split())[:300],
            'compile_seconds': round(time.monotonic() - start, 1)}
  return _row(encoding, label, figures, flops, peak, time.monotonic() - start,
              chosen_impl=cfg.attention_impl, block=int(c.model.block_size))


def anchor_row(config, devices, peak: float, block: int, priced: bool = True) -> dict:
  """The stock splash layer at the shape of `config` (any of the rows' presets); `priced`:
  splash's kernels carry the project's cost estimate (False: as splash ships, unpriced)."""
  start = time.monotonic()
  resolved = aot.resolve(config, len(devices))
  mesh = aot._mesh(resolved.mesh, devices, 1)  # pylint: disable=protected-access
  setup = setup_lib.build(resolved, mesh)
  cfg = setup.model.config
  batch, t = int(resolved.train.batch_size), setup.seq_len
  block = min(block, t)
  tokens = batch * t // len(devices)
  fields = dict(cfg.__dict__, position_encoding='rope') if hasattr(cfg, '__dict__') else cfg
  flops = layer_model_flops(types.SimpleNamespace(**fields), t, tokens)
  itemsize = jnp.dtype(cfg.compute_dtype).itemsize
  kernel = splash_kernel(cfg.num_heads, t, block)
  pricing = (splash_priced(cfg.num_heads, t, cfg.head_size, block, itemsize) if priced
             else contextlib.nullcontext())
  with setup.context(), pricing:
    fn, args = anchor_layer(cfg, mesh, batch, t, kernel)
    figures = _compile(fn, args, 'stock splash layer', flops)
  return _row(ANCHOR, f'splash, blocks {block}, seq-minor', figures, flops, peak,
              time.monotonic() - start)


def step_check(config, encoding: str, impl: str, devices, topology: str, layer_ms: float):
  """Per-layer ms by the 1- and 2-layer steps (train/compile.py's way) against `layer_ms`."""
  start = time.monotonic()
  c = config.copy_and_resolve_references()
  c.model.attention_impl = impl
  c.model.scan_layers = True
  p = step_cost.predict(c, topology, devices,
                        progress=lambda line: print(f'  {line}', flush=True))
  step_ms = p.per_layer_seconds * 1e3
  updated = cost_row(config, encoding, impl, devices, 0.0, with_update=True)
  return {'encoding': encoding, 'impl': impl, 'layer_alone_ms': layer_ms,
          'step_difference_ms': step_ms, 'costing_ms': [s * 1e3 for s in p.seconds],
          'ratio': layer_ms / step_ms if step_ms else float('nan'),
          'layer_with_update_ms': updated.get('ms', float('nan')),
          'ratio_with_update': updated.get('ms', float('nan')) / step_ms if step_ms
                               else float('nan'),
          'compile_seconds': round(time.monotonic() - start, 1)}


def plan(encodings, impls, anchor: bool):
  """The rows in measuring order: the anchor, FIRST's rows, then the rest (each encoding on
  every TPU path that computes it: attention/support.py)."""
  from bipe_jax import schemes  # pylint: disable=g-import-not-at-top
  rows = []
  for encoding in encodings:
    scheme = schemes.get_scheme(encoding)
    rows += [(encoding, i) for i in impls if support.supports(i, scheme)]
  ordered = [r for r in FIRST if r in rows] + [r for r in rows if r not in FIRST]
  return ([(ANCHOR, None)] if anchor else []) + ordered


def with_block_sizes(rows, block_sizes):
  """`plan`'s rows as (encoding, impl, block): each Pallas row once per size of
  `block_sizes` in that order, the others (and every row without sizes) with block None (the
  config's)."""
  out = []
  for encoding, impl in rows:
    sizes = tuple(block_sizes) if impl == 'pallas' and block_sizes else (None,)
    out += [(encoding, impl, size) for size in sizes]
  return out


# hlo_stats.optimal_seconds reads a negative figure (XLA prices each ConcatBitcast custom call at
# -1 s, a sentinel) as its fraction above the next lower second. A layer at these shapes costs
# well under a second; a corrected figure of a second or more is not a time (the blockwise rows
# gave hundreds of seconds when every ConcatBitcast of the text was added back).
SENTINEL_RESIDUE_MS = 1000.0


def has_figure(row) -> bool:
  """Whether a costed row's ms is a time: no ConcatBitcast, or a corrected figure below
  SENTINEL_RESIDUE_MS."""
  return 'ms' in row and (not row.get('concat_bitcasts') or row['ms'] < SENTINEL_RESIDUE_MS)


def block_table(rows) -> str:
  """ms per layer (MFU) of the Pallas rows by block size, one line per encoding; '' when the
  rows hold fewer than two block sizes."""
  pallas = [r for r in rows if r['impl'].startswith('pallas, block ')]
  sizes = sorted({r['block'] for r in pallas})
  if len(sizes) < 2:
    return ''
  anchor = next((r['ms'] for r in rows if r['encoding'] == ANCHOR and has_figure(r)), 0.0)
  cells = []
  for encoding in dict.fromkeys(r['encoding'] for r in pallas):
    line = [encoding]
    for size in sizes:
      r = next((r for r in pallas if r['encoding'] == encoding and r['block'] == size), None)
      if r is None or 'error' in r or not has_figure(r):
        line.append('-')
      else:
        ratio = f", {r['ms'] / anchor:.2f}x stock" if anchor else ''
        line.append(f"{r['ms']:.4g} ({100 * r['mfu']:.1f} %{ratio})")
    cells.append(line)
  return common.markdown_table(['layer (pallas)'] + [f'block {s}: ms (MFU)' for s in sizes],
                               cells)


def table(rows, checks) -> str:
  """The Markdown table of `rows` (x stock: ms over the anchor's), then the step checks."""
  anchor = next((r['ms'] for r in rows if r['encoding'] == ANCHOR and has_figure(r)), 0.0)
  cells = []
  for r in rows:
    if 'error' in r:
      cells.append([r['encoding'], r['impl'], '-', '-', '-', r['error'][:120]])
    elif not has_figure(r):  # optimal_seconds came back as a sentinel sum
      cells.append([r['encoding'], r['impl'], '?', '?', '?',
                    f"no figure: {r['concat_bitcasts']} ConcatBitcast custom calls; "
                    f"optimal_seconds as corrected {r['ms']:.4g} ms (not a time)"])
    else:
      cells.append([r['encoding'], r['impl'], f"{r['ms']:.4g}", f"{100 * r['mfu']:.1f} %",
                    f"{r['ms'] / anchor:.2f}" if anchor else '-',
                    f"{r['temp_gib']:.2f} GiB temporaries, compiled in {r['compile_seconds']} s"
                    + (f"; {r['concat_bitcasts']} ConcatBitcasts counted free"
                       if r.get('concat_bitcasts') else '')])
  text = common.markdown_table(['layer', 'attention', 'ms (fwd + bwd)', 'MFU', 'x stock',
                                'notes'], cells)
  if (blocks := block_table(rows)):
    text += '\n\nThe Pallas layer by tile size (block_q = block_k):\n\n' + blocks
  for c in checks:
    text += (f"\n\nLayer alone against the step difference ({c['encoding']}, {c['impl']}): "
             f"{c['layer_alone_ms']:.3f} ms against {c['step_difference_ms']:.3f} ms "
             f"(1- and 2-layer steps {c['costing_ms'][0]:.2f} / {c['costing_ms'][1]:.2f} ms), "
             f"ratio {c['ratio']:.4f}; with the optimizer's update of the layer's parameters "
             f"{c['layer_with_update_ms']:.3f} ms, ratio {c['ratio_with_update']:.4f}.")
  return text


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--config', default='configs/paper_151m_tpu.py')
  parser.add_argument('--topology', default='v5e:2x4')
  parser.add_argument('--encodings', default=','.join(ENCODINGS))
  parser.add_argument('--impls', default=','.join(TPU_IMPLS))
  parser.add_argument('--noanchor', dest='anchor', action='store_false')
  parser.add_argument('--splash_block', type=int, default=512)
  parser.add_argument('--check_step', default='',
                      help='ENC:IMPL: also cost that row from the 1- and 2-layer steps')
  parser.add_argument('--batch_per_chip', type=int, default=0)
  parser.add_argument('--seq', type=int, default=0)
  for flag in ('width', 'heads', 'ffn', 'vocab', 'block_size'):
    parser.add_argument(f'--{flag}', type=int, default=0)
  parser.add_argument('--block_sizes', default='',
                      help='e.g. 128,256,512,1024: each pallas row once per tile size')
  parser.add_argument('--out', default=os.path.join(ROOT, 'benchmarks', 'results',
                                                    'tpu_layer_cost'))
  args = parser.parse_args(argv)
  encodings = [e for e in args.encodings.split(',') if e]
  impls = [i for i in args.impls.split(',') if i]
  block_sizes = [int(b) for b in args.block_sizes.split(',') if b]
  unknown = [i for i in impls if i not in TPU_IMPLS]
  if unknown:
    print(f'--impls: {unknown} are not TPU paths ({", ".join(TPU_IMPLS)})', file=sys.stderr)
    return 2
  devices = topologies.topology_devices(args.topology)
  args.num_devices = len(devices)
  configs = {e: shaped(preset_config(args.config, e), args) for e in encodings}
  base = configs[encodings[0]] if encodings else shaped(preset_config(args.config, 'rope'), args)
  peak, _ = flops_lib.peak_flops_per_device(devices[0].device_kind, 'tpu', base.model.dtype)
  header = (f'{args.config} shape: {int(base.train.batch_size) // len(devices)} x '
            f'{int(base.data.seq_len)} tokens per chip, width {int(base.model.hidden_size)}, '
            f'{int(base.model.num_heads)} heads, {base.model.dtype}, remat {base.model.remat}, '
            f'on {args.topology} ({devices[0].device_kind}, {peak / 1e12:.0f} TFLOP/s peak)')
  print(header, flush=True)
  rows, checks = [], []

  def save():
    notes = [f'{step_cost.LABEL}; one layer, forward + backward, per chip.', header,
             f'Host: {common.cpu_model()}; load average {common.load_average():.2f}.']
    text = '\n'.join(['### One layer by XLA\'s TPU cost model', '', table(rows, checks), '']
                     + [f'- {n}' for n in notes])
    common.write_results(args.out, text, {
        'machine': common.machine_info(), 'label': step_cost.LABEL, 'shape': header,
        'rows': rows, 'step_checks': checks})

  for encoding, impl, block in with_block_sizes(plan(encodings, impls, args.anchor),
                                                block_sizes):
    label = impl if block is None else f'{impl}, block {block}'
    print(f'{encoding} / {label or "splash"}: compiling ...', flush=True)
    if encoding == ANCHOR:
      row = anchor_row(base, devices, peak, args.splash_block)
    else:
      row = cost_row(configs[encoding], encoding, impl, devices, peak, block=block)
    rows.append(row)
    print(f'  {row}', flush=True)
    save()
  if args.check_step:
    encoding, impl = args.check_step.split(':')
    layer = next((r for r in rows if r['encoding'] == encoding and 'ms' in r
                  and r['impl'].split(',')[0] == impl), None)
    if layer is None:
      print(f'--check_step {args.check_step}: no costed row of that name', file=sys.stderr)
      return 2
    config = preset_config(args.config, encoding)
    shaped_config = shaped(config, args)
    with shaped_config.unlocked() if hasattr(shaped_config, 'unlocked') else \
        contextlib.nullcontext():
      shaped_config.model.num_layers = int(config.model.num_layers)
    checks.append(step_check(shaped_config, encoding, impl, devices, args.topology,
                             layer['ms']))
    print(f'  {checks[-1]}', flush=True)
    save()
  print(table(rows, checks), flush=True)
  return 1 if any('error' in r for r in rows) else 0


if __name__ == '__main__':
  sys.exit(main())
