"""Unit tests of bipe_jax.training on one CPU device, with small stand-ins where useful.

The stand-ins (a 2-layer MLP language model with logical partitioning, and a list-backed
iterator with get_state/set_state) keep these tests fast and independent of the model and
data code; end-to-end tests with the real model and data are in test_training_e2e.py.
"""

import gc
import math
import os
import shutil
import signal

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from configs import base
from bipe_jax.state import checkpointing
from bipe_jax import run_config
from bipe_jax.training import resolve as resolve_lib
from bipe_jax.training import data_loading
from bipe_jax.training import flops
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer
from bipe_jax.training import progress
from bipe_jax.state import train_state
from bipe_jax.training import train_step
from bipe_jax.training import trainer

VOCAB, SEQ = 64, 12


class TinyLM(nn.Module):
  """Embedding -> causal running mean -> SwiGLU-ish MLP -> unembedding, logically annotated."""
  dim: int = 16

  @nn.compact
  def __call__(self, tokens_BxT, positions=None, decode=False):
    part = nn.with_logical_partitioning
    emb = self.param('embed', part(nn.initializers.normal(0.5), ('vocab', 'embed')),
                     (VOCAB, self.dim))
    x = nn.with_logical_constraint(emb[tokens_BxT], ('batch', 'length', 'embed'))
    x = jnp.cumsum(x, axis=1) / jnp.arange(1, x.shape[1] + 1)[None, :, None]
    h = nn.Dense(32, use_bias=False,
                 kernel_init=part(nn.initializers.lecun_normal(), ('embed', 'mlp')))(x)
    x = x + nn.Dense(self.dim, use_bias=False,
                     kernel_init=part(nn.initializers.lecun_normal(), ('mlp', 'embed')))(
                         jax.nn.silu(h))
    scale = self.param('norm', part(nn.initializers.ones, ('embed',)), (self.dim,))
    return nn.Dense(VOCAB, use_bias=False,
                    kernel_init=part(nn.initializers.lecun_normal(), ('embed', 'vocab')))(
                        x * scale)


class ListIterator:
  """Rows of a fixed random token table: shard s of S takes rows s, s+S, ... (checkpointable)."""

  def __init__(self, rows, shard=0, num_shards=1, kill_at=None, seed=0):
    table = np.random.default_rng(seed).integers(0, VOCAB, (4096, SEQ)).astype(np.int32)
    self.table = table[shard::num_shards]
    self.rows = rows
    self.position = 0
    self.kill_at = kill_at
    self.calls = 0

  def __iter__(self):
    return self

  def __next__(self):
    self.calls += 1
    if self.kill_at is not None and self.calls == self.kill_at:
      os.kill(os.getpid(), signal.SIGTERM)  # "preempted" while producing this batch
    out = self.table[self.position:self.position + self.rows]
    self.position += self.rows
    return {'tokens': out}

  def get_state(self):
    return {'position': self.position}

  def set_state(self, state):
    self.position = state['position']


def small_config(**train):
  config = base.get_base_config()
  config.data.seq_len = SEQ
  config.train.batch_size = 4
  config.train.steps = 6
  config.train.warmup_steps = 2
  config.train.learning_rate = 1e-2
  config.train.log_every = 1
  config.checkpoint.every_steps = 2
  config.checkpoint.async_save = False
  for k, v in train.items():
    config.train[k] = v
  return config


def one_device_mesh():
  config = base.get_base_config()
  return mesh_lib.make_mesh(config.mesh, devices=jax.devices()[:1])


# ------------------------------------------------------------------ mesh and sharding

def test_resolve_mesh_shape_fills_and_rejects():
  assert mesh_lib.resolve_mesh_shape((-1, 2, 1, 2), 8) == (2, 2, 1, 2)
  assert mesh_lib.resolve_mesh_shape((2, -1, 1, 1), 8) == (2, 4, 1, 1)
  assert mesh_lib.resolve_mesh_shape((1, 1, 1, 1), 1) == (1, 1, 1, 1)
  with pytest.raises(ValueError, match='does not divide the device count 8'):
    mesh_lib.resolve_mesh_shape((-1, 3, 1, 1), 8)
  with pytest.raises(ValueError, match='uses 4 devices but 8 are available'):
    mesh_lib.resolve_mesh_shape((2, 2, 1, 1), 8)
  with pytest.raises(ValueError, match='at most one mesh axis may be -1'):
    mesh_lib.resolve_mesh_shape((-1, -1, 1, 1), 8)


def test_logical_rules_map_params_and_activations():
  rules = mesh_lib.LOGICAL_AXIS_RULES
  assert nn.logical_to_mesh_axes(('vocab', 'embed'), rules) == P('tensor', 'fsdp')
  assert nn.logical_to_mesh_axes(('embed', 'heads', 'head_dim'), rules) == P('fsdp', 'tensor', None)
  assert nn.logical_to_mesh_axes(('embed', 'mlp'), rules) == P('fsdp', 'tensor')
  # activations: batch takes (data, fsdp), length context, so embed is left unsharded
  assert nn.logical_to_mesh_axes(('batch', 'length', 'embed'), rules) == P(
      ('data', 'fsdp'), 'context', None)


def test_fit_spec_replicates_dimensions_the_mesh_does_not_divide():
  mesh = one_device_mesh()
  fake = type('M', (), {'shape': {'data': 1, 'fsdp': 2, 'tensor': 8}})()
  assert mesh_lib._fit_spec(P('tensor', 'fsdp'), (4, 6), fake) == P(None, 'fsdp')
  assert mesh_lib._fit_spec(P(('data', 'fsdp'), None), (3, 5), fake) == P(None, None)
  assert mesh.shape['data'] == 1


def test_global_batch_on_one_device_keeps_rows():
  mesh = one_device_mesh()
  rows = np.arange(24, dtype=np.int32).reshape(4, 6)
  out = mesh_lib.global_batch({'tokens': rows}, mesh, 4)
  np.testing.assert_array_equal(np.asarray(out['tokens']), rows)
  assert mesh_lib.process_data_shard(mesh, 4) == (0, 1)


# ------------------------------------------------------------------ optimizer

def test_linear_schedule_hand_values():
  t = small_config(learning_rate=1.0, warmup_steps=4, steps=12, end_learning_rate_ratio=0.0).train
  lr = optimizer.learning_rate_schedule(t)
  got = [float(lr(s)) for s in (0, 1, 3, 4, 8, 12, 20)]
  # warmup (s+1)/4; then 1 - (s-4)/8
  np.testing.assert_allclose(got, [0.25, 0.5, 1.0, 1.0, 0.5, 0.0, 0.0], atol=1e-7)


def test_cosine_schedule_hand_values():
  t = small_config(learning_rate=2.0, warmup_steps=0, steps=10, schedule='cosine',
                   end_learning_rate_ratio=0.1).train
  lr = optimizer.learning_rate_schedule(t)
  for s in (0, 3, 5, 10):
    want = 0.2 + 0.5 * 1.8 * (1 + math.cos(math.pi * s / 10))
    np.testing.assert_allclose(float(lr(s)), want, rtol=1e-6)


def test_weight_decay_only_on_matrices():
  params = {'w': jnp.ones((2, 3)), 'scale': jnp.ones((3,))}
  t = small_config(learning_rate=0.0, weight_decay=0.5, grad_clip=0.0, warmup_steps=0).train
  t.learning_rate = 1.0
  tx = optimizer.make_optimizer(t)
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero, tx.init(params), params)
  # zero gradients: the Adam part is 0, the decay part is -lr * wd * p on matrices only
  np.testing.assert_allclose(updates['w'], -0.5 * np.ones((2, 3)), rtol=1e-6)
  np.testing.assert_allclose(updates['scale'], np.zeros(3), atol=0)


# ------------------------------------------------------------------ loss and step

def test_next_token_nll_matches_loop_reference():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
  tokens = rng.integers(0, 6, (2, 5)).astype(np.int32)  # 6 only where set below
  tokens[1, 3] = 6  # pad id below
  total, count = 0.0, 0
  for b in range(2):
    for t in range(4):
      target = tokens[b, t + 1]
      if target == 6:
        continue
      row = logits[b, t].astype(np.float64)
      total += math.log(np.exp(row - row.max()).sum()) + row.max() - row[target]
      count += 1
  got_sum, got_count = train_step.next_token_nll(jnp.asarray(logits), jnp.asarray(tokens), 6)
  np.testing.assert_allclose(float(got_sum), total, rtol=1e-5)
  assert float(got_count) == count == 7


@pytest.mark.parametrize('with_mask', [False, True])
def test_grad_accumulation_equals_one_big_batch(with_mask):
  mesh = one_device_mesh()
  model, t = TinyLM(), small_config().train
  tx, lr = optimizer.make_optimizer(t), optimizer.learning_rate_schedule(t)
  tokens = ListIterator(8).__next__()['tokens']
  batch = {'tokens': jnp.asarray(tokens)}
  if with_mask:  # an output-only loss: rows score different numbers of targets
    mask = np.arange(tokens.shape[1])[None, :] >= (np.arange(tokens.shape[0]) % 5)[:, None] + 2
    batch['loss_mask'] = jnp.asarray(mask)
  results = []
  for accum in (1, 4):
    state, sh = train_state.create_train_state(model, tx, mesh, SEQ, seed=0)
    step = train_step.make_train_step(model, tx, lr, mesh, sh, grad_accum_steps=accum,
                                      loss_chunk_tokens=0)
    with train_state.mesh_context(mesh):
      for _ in range(2):
        state, metrics = step(state, batch)
    results.append((jax.device_get(state.params), float(metrics['loss']),
                    float(metrics['targets'])))
  chex.assert_trees_all_close(results[0][0], results[1][0], atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)
  full = tokens.shape[0] * (tokens.shape[1] - 1)
  assert results[0][2] == results[1][2] and (results[0][2] < full) == with_mask


# ------------------------------------------------------------------ FLOPs, progress

def test_flops_formula_matches_parameter_count_of_the_real_model():
  """Matmul FLOPs (no attention core) = 2 x the non-embedding matrix parameters + unembedding."""
  model_lib = pytest.importorskip('bipe_jax.model')
  from bipe_jax import config as model_config_lib
  m = base.get_base_config().model
  m.position_encoding, m.vocab_size, m.hidden_size, m.num_layers = 'rope', 96, 32, 2
  m.num_heads, m.num_kv_heads, m.ffn_size = 4, 2, 48
  cfg = model_config_lib.model_config_from_dict(m)
  shapes = jax.eval_shape(lambda: model_lib.Transformer(cfg).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))['params']
  shapes = nn.unbox(shapes)
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  matmul = sum(math.prod(v.shape) for k, v in flat
               if 'kernel' in jax.tree_util.keystr(k))  # query/key/value/out/gate/up/down/lm_head
  seq = 16
  attention_core = 2 * 2 * 4 * 8 * (seq + 1) / 2 * 2  # q.k and p.v, H=4, Dh=8, 2 layers
  np.testing.assert_allclose(flops.forward_flops_per_token(m, seq),
                             2 * matmul + attention_core, rtol=1e-9)
  assert flops.train_flops_per_token(m, seq) == 3 * flops.forward_flops_per_token(m, seq)
  np.testing.assert_allclose(flops.mfu(1000.0, 2e8, 4e11), 0.5)


def test_progress_line_and_duration():
  line = progress.format_line(120, 600, {'loss': 4.21134, 'tokens_per_sec': 31204.4,
                                          'mfu': 0.0961, 'learning_rate': 2e-3,
                                          'eta_sec': 92.0})
  assert line == ('step 120/600 | loss 4.2113 | 31,204 tok/s | MFU 9.6% | lr 2.00e-03 | '
                  'ETA 1m32s')
  assert progress.format_duration(3 * 3600 + 61) == '3h01m'
  assert progress.format_duration(7) == '7s'


# ------------------------------------------------------------------ config validation

@pytest.mark.parametrize('section,field,value,fragment', [
    ('model', 'position_encoding', 'bogus', 'model.position_encoding'),
    ('train', 'learning_rate', -1e-3, 'train.learning_rate=-0.001'),
    ('train', 'batch_size', 6, 'train.batch_size=6'),
    ('train', 'schedule', 'step', 'train.schedule'),
    ('train', 'grad_accum_steps', 0, 'train.grad_accum_steps'),
    ('mesh', 'data', 3, 'mesh.data=3'),
    ('mesh', 'tensor', 0, 'mesh.tensor=0'),
    ('checkpoint', 'every_steps', 0, 'checkpoint.every_steps'),
])
def test_bad_config_values_give_one_line_naming_the_field(section, field, value, fragment):
  config = small_config()
  config.mesh.data = -1
  config.train.batch_size = 8
  config[section][field] = value
  device_count = 4
  with pytest.raises(run_config.ConfigError) as info:
    resolve_lib.resolve(config, device_count=device_count)
  message = str(info.value)
  assert fragment in message and '\n' not in message


def test_batch_must_divide_across_data_shards():
  config = small_config()
  config.mesh.data, config.train.batch_size = 4, 6
  with pytest.raises(run_config.ConfigError, match=r'train.batch_size=6 .*\(= 4\)'):
    resolve_lib.resolve(config, device_count=4)


def test_vocab_mismatch_and_separator_resolution():
  class FakeTokenizer:
    vocab_size, path, bos_id, eos_id = 4096, '/x/spm.model', 1, 2

    def separator_ids(self, rule):
      assert rule == 'sentence'  # 'auto' on the embedded corpus (prose and code)
      return (13, 7)

  config = base.get_base_config()
  resolve = lambda: resolve_lib.resolve(config, device_count=1, tokenizer=FakeTokenizer())  # pylint: disable=unnecessary-lambda-assignment
  assert resolve().model.separator_ids == (13, 7)
  config.model.bos_id = 3
  with pytest.raises(run_config.ConfigError, match=r'model.bos_id=3 does not match.*bos_id 1'):
    resolve()
  config.model.bos_id = 1
  config.model.vocab_size = 512
  with pytest.raises(run_config.ConfigError, match='model.vocab_size=512 does not match'):
    resolve()


# ------------------------------------------------------------------ data shards

def test_sharded_loader_same_global_batch_for_any_process_count():
  make = lambda cfg, rows, shard, count: ListIterator(rows, shard, count)  # noqa: E731
  one = data_loading.ShardedDataLoader(make, None, global_batch_size=8, num_shards=4,
                                       process_slice=(0, 1))
  halves = [data_loading.ShardedDataLoader(make, None, global_batch_size=8, num_shards=4,
                                           process_slice=(p, 2)) for p in range(2)]
  for _ in range(3):
    whole = next(one)['tokens']
    parts = np.concatenate([next(h)['tokens'] for h in halves])
    np.testing.assert_array_equal(whole, parts)
  # state of both halves merged restores the single-process loader and vice versa
  merged = {'num_shards': 4, 'shards': {**halves[0].get_state()['shards'],
                                         **halves[1].get_state()['shards']}}
  fresh = data_loading.ShardedDataLoader(make, None, global_batch_size=8, num_shards=4,
                                         process_slice=(0, 1))
  fresh.set_state(merged)
  np.testing.assert_array_equal(next(fresh)['tokens'], next(one)['tokens'])
  with pytest.raises(ValueError, match='train.data_shards=4'):
    fresh.set_state({'num_shards': 2, 'shards': {}})


# ------------------------------------------------------------------ checkpoints and the loop

def _train(tmp_path, name, config, kill_at=None):
  """trainer.train with the stand-ins; shard iterators get `kill_at` on shard 0."""
  def make(cfg, rows, shard, count):
    return ListIterator(rows, shard, count, kill_at=kill_at if shard == 0 else None)
  return trainer.train(config, str(tmp_path / name), model=TinyLM(), make_iterator=make)


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  """An uninterrupted 6-step run with the stand-ins (the reference of the resume tests)."""
  root = tmp_path_factory.mktemp('full')
  full = _train(root, 'full', small_config())
  assert sorted(full.losses) == list(range(1, 7)) and full.checkpoint_steps == [2, 4, 6]
  full.workdir = root / 'full'
  events = list((full.workdir / 'tensorboard').glob('events.out.tfevents*'))
  assert events and events[0].stat().st_size > 0  # TensorBoard scalars written
  lines = (full.workdir / 'metrics.jsonl').read_text().splitlines()
  assert len(lines) == 6 and '"mfu"' in lines[-1]
  return full


def test_resume_after_sigterm_reproduces_losses_and_batches(tmp_path, uninterrupted):
  config, full = small_config(), uninterrupted
  first = _train(tmp_path, 'cut', config, kill_at=3)  # SIGTERM while fetching step 3
  assert first.preempted and first.step == 3 and first.checkpoint_steps == [2, 3]
  second = _train(tmp_path, 'cut', config)
  assert second.start_step == 3 and second.step == 6
  losses = {**first.losses, **second.losses}
  np.testing.assert_allclose([losses[s] for s in range(1, 7)],
                             [full.losses[s] for s in range(1, 7)], rtol=1e-6)
  again = _train(tmp_path, 'cut', config)  # finished run: resumes at the end, no steps
  assert again.start_step == 6 and again.losses == {}


# A failed Orbax restore leaves some of its read coroutines un-awaited (harmless).
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_corrupt_latest_checkpoint_falls_back_with_warning(tmp_path, capsys, uninterrupted):
  config, full = small_config(), uninterrupted
  _train(tmp_path, 'run', config)
  ckpt = tmp_path / 'run' / 'checkpoints'
  for path in (ckpt / '6' / 'state').rglob('*'):
    if path.is_file() and path.stat().st_size > 0 and 'ocdbt' in str(path.parent):
      path.write_bytes(b'garbage')  # corrupt the array data of the latest checkpoint
  shutil.rmtree(ckpt / '4' / 'data')  # and remove an item of the one before
  resumed = _train(tmp_path, 'run', config)
  out = capsys.readouterr().out
  assert 'checkpoint step 6' in out and 'checkpoint step 4' in out and 'falling back' in out
  assert resumed.start_step == 2
  assert (tmp_path / 'run' / 'checkpoints_corrupt' / '6').is_dir()
  np.testing.assert_allclose([resumed.losses[s] for s in range(3, 7)],
                             [full.losses[s] for s in range(3, 7)], rtol=1e-6)
  gc.collect()  # finalise Orbax's abandoned read coroutines inside this test's warning filter


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  config = small_config(learning_rate=1e30, warmup_steps=0, grad_clip=0.0)
  config.checkpoint.every_steps = 1
  with pytest.raises(trainer.NonFiniteLossError, match=r'at step (\d+): stopping; the last '
                                                       r'good checkpoint is step'):
    _train(tmp_path, 'nan', config)
  ckpt = checkpointing.Checkpointer(str(tmp_path / 'nan' / 'checkpoints'), read_only=True)
  steps = ckpt.all_steps()
  assert steps and max(steps) >= 1
  mesh = one_device_mesh()
  tx = optimizer.make_optimizer(config.train)
  abstract, sh = train_state.state_shardings(TinyLM(), tx, mesh, SEQ)
  step, state, _ = ckpt.restore_latest(train_state.abstract_with_shardings(abstract, sh))
  ckpt.close()
  assert step == max(steps)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.params)))


def test_data_state_from_another_process_count_is_a_clear_error(tmp_path):
  directory = tmp_path / 'item'
  directory.mkdir()
  (directory / 'process_1-of-2.json').write_text('{"json": {"position": 3}}')
  with pytest.raises(checkpointing.IncompatibleCheckpointError, match='another process count'):
    checkpointing.DataStateHandler().restore(directory)


@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_checkpoint_of_another_model_is_an_error_not_a_corruption(uninterrupted):
  mesh = one_device_mesh()
  tx = optimizer.make_optimizer(small_config().train)
  abstract, sh = train_state.state_shardings(TinyLM(dim=8), tx, mesh, SEQ)
  ckpt = checkpointing.Checkpointer(str(uninterrupted.workdir / 'checkpoints'), every_steps=2,
                                    keep=3, async_save=False)
  with pytest.raises(checkpointing.IncompatibleCheckpointError,
                     match=r'other parameters \(other shapes: params/Dense_0/kernel \(16, 32\) in '
                           r'the checkpoint vs \(8, 32\)'):
    ckpt.restore_latest(train_state.abstract_with_shardings(abstract, sh))
  assert ckpt.all_steps() == [2, 4, 6]  # nothing moved aside
  ckpt.close()
  gc.collect()


def test_distributed_flags_are_checked_and_default_is_single_process(monkeypatch):
  from bipe_jax.training import distributed
  for name in ('SLURM_NTASKS', 'SLURM_JOB_ID', 'TPU_WORKER_HOSTNAMES',
               'MEGASCALE_COORDINATOR_ADDRESS'):
    monkeypatch.delenv(name, raising=False)
  assert distributed.initialize() is False
  with pytest.raises(ValueError, match='--num_processes >= 1 and 0 <= --process_id'):
    distributed.initialize('127.0.0.1:1234', num_processes=2, process_id=2)
  with pytest.raises(ValueError, match='need --coordinator_address'):
    distributed.initialize('', num_processes=2, process_id=0)


def test_token_nll_value_and_gradient_equal_the_automatic_ones():
  logits = jax.random.normal(jax.random.PRNGKey(3), (2, 5, 11)) * 3
  targets = jax.random.randint(jax.random.PRNGKey(4), (2, 5), 0, 11)
  weights = jax.random.uniform(jax.random.PRNGKey(5), (2, 5))

  def plain(x):
    return jnp.sum(-jnp.take_along_axis(jax.nn.log_softmax(x), targets[..., None], -1)[..., 0]
                   * weights)

  def fused(x):
    return jnp.sum(train_step.token_nll(x, targets) * weights)

  np.testing.assert_allclose(fused(logits), plain(logits), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(fused)(logits), jax.grad(plain)(logits), rtol=1e-5,
                             atol=1e-7)
  np.testing.assert_allclose(jax.jit(jax.grad(fused))(logits), jax.grad(plain)(logits),
                             rtol=1e-5, atol=1e-7)


def test_a_finished_run_says_there_is_nothing_to_train():
  from bipe_jax.training import trainer  # pylint: disable=g-import-not-at-top
  assert trainer.steps_to_train(4, 20) == 'training steps 5..20'
  line = trainer.steps_to_train(20, 20)
  assert '21..20' not in line and line.startswith('nothing to train: the run is at step 20')
