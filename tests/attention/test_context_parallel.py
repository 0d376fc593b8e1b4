"""Context parallelism (bipe_jax/attention/context_parallel.py): the sequence sharded over a mesh axis.

The position carry is checked in-process (chunks of a row, one after another, give the row's
streams). The sharded model runs in ONE subprocess with 8 fake CPU devices (XLA_FLAGS must be
set before JAX starts): it prints, per case, the largest differences between the sharded and
the unsharded computation, and the tests here assert on them.
"""

import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bipe_jax import positions
from tests.fixtures import cpu_env
from tests import fixtures
from tests import forkserver

ROOT = fixtures.ROOT
VOCAB, SEP, BOS, PAD = 24, 3, 1, 0
PARA = 2  # paragraph separator of hierarchical BiPE (bipe3_rope)
T, CONTEXT = 64, 4  # 4 shards of 16 tokens
ENCODINGS = {  # encoding -> attention_impl: every impl takes the gathered-keys path (blockwise
  #             runs as dense inside a shard for now: context_parallel.gathered_kv_attention)
    'rope': 'dense', 'bipe_rope': 'blockwise', 'alibi': 'fused', 'bipe_alibi': 'blockwise',
    'bipe3_rope': 'blockwise',
    # the bilevel forget gate: c is a prefix sum carried across the shards
    # (context_parallel.global_cumsum); fox differs only in where the gates act
    'bipe_fox': 'blockwise'}


def boundary_tokens(rows: int = 4, seed: int = 0) -> np.ndarray:
  """[rows, T] ids with separators on shard boundaries (last token of a shard, first token of
  the next), documents spanning shards, a segment spanning three shards, and padding."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(4, VOCAB, size=(rows, T)).astype(np.int32)
  shard = T // CONTEXT
  tokens[0, [shard - 1, 2 * shard, 3 * shard - 1, 3 * shard]] = SEP
  tokens[0, [0, 20, 45]] = BOS  # documents 0..2, each spanning a shard edge
  tokens[1, [5, 6, 7]] = SEP  # then one segment from 8 through the end of shard 3
  tokens[1, 30] = BOS
  tokens[2, ::7] = SEP
  tokens[2, [shard, 2 * shard]] = BOS  # a document starting exactly at a shard start
  tokens[3, :18] = PAD  # a whole shard and more of leading padding
  tokens[3, [18, 40]] = BOS
  tokens[3, [shard * 2 - 1, 50]] = SEP
  tokens[2, [shard - 1, 2 * shard + 3, 3 * shard]] = PARA  # paragraphs ending on shard edges
  tokens[1, [2 * shard - 1, 40]] = PARA
  return tokens


def _streams(p, names=('token', 'intra', 'inter', 'document')):
  return np.stack([np.asarray(getattr(p, n)) for n in names])


_ALL_STREAMS = ('token', 'intra', 'inter', 'document', 'paragraph', 'sentence')


@pytest.mark.parametrize('restart', [False, True])
def test_chunks_with_carries_give_the_streams_of_the_whole_row(restart):
  """Chunks of a row computed one after another (the carry of a chunk = the combined summaries
  of the chunks before it) equal the streams of the whole row: the rule the shards use."""
  tokens = boundary_tokens()
  table = positions.separator_table(VOCAB, (SEP,))
  docs = positions.separator_table(VOCAB, (BOS,))
  kwargs = dict(document_start_table_V=docs, pad_id=PAD)
  want = _streams(positions.bilevel_positions(tokens, table, restart_at_documents=restart,
                                              **kwargs))
  edges = [0, 7, 16, 17, 33, 47, 48, 64]  # uneven chunks, several inside one segment
  carry = positions.PositionCarry.empty(tokens.shape[0])
  got = []
  for lo, hi in zip(edges[:-1], edges[1:]):
    chunk = tokens[:, lo:hi]
    got.append(_streams(positions.bilevel_positions(
        chunk, table, restart_at_documents=restart, carry=carry, **kwargs)))
    carry = positions.combine_carries(carry, positions.chunk_carry(chunk, table, **kwargs))
  np.testing.assert_array_equal(np.concatenate(got, axis=2), want)
  # The carry after the last chunk is the summary of the whole row.
  whole = positions.chunk_carry(tokens, table, **kwargs)
  for a, b in zip(jax.tree.leaves(carry), jax.tree.leaves(whole)):
    np.testing.assert_array_equal(a, b)


def test_combining_summaries_is_associative():
  table = positions.separator_table(VOCAB, (SEP,))
  kwargs = dict(document_start_table_V=positions.separator_table(VOCAB, (BOS,)), pad_id=PAD)
  tokens = boundary_tokens(seed=1)
  a, b, c = (positions.chunk_carry(tokens[:, lo:lo + 16], table, **kwargs)
             for lo in (0, 16, 32))
  comb = positions.combine_carries
  for x, y in zip(jax.tree.leaves(comb(comb(a, b), c)), jax.tree.leaves(comb(a, comb(b, c)))):
    np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------------ the 8-device subprocess

def _model(encoding, impl, restart=False):
  from bipe_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  cfg = config_lib.ModelConfig(
      vocab_size=VOCAB, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, ffn_size=64,
      max_intra=T, max_position=T, train_length=T, separator_ids=(SEP,), bos_id=BOS,
      paragraph_ids=(PARA,),
      pad_id=PAD, mask_across_documents=True, restart_at_documents=restart,
      position_encoding=encoding, attention_impl=impl, block_size=8)
  return model_lib.Transformer(config_lib.validate_model_config(cfg))


def _mesh(data, context):
  from bipe_jax.state import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  sizes = ml_collections.ConfigDict({'data': data, 'fsdp': 1, 'context': context, 'tensor': 1})
  return mesh_lib.make_mesh(sizes, devices=jax.devices()[:data * context])


def _max_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _all_gathers(hlo_text: str) -> list:
  """(element count, op name) of the result of every all-gather in a compiled program."""
  import re  # pylint: disable=g-import-not-at-top
  found = []
  for line in hlo_text.splitlines():
    if 'all-gather(' in line or 'all-gather-start(' in line:
      dims = re.search(r'=\s*\(?[a-z0-9]+\[([0-9,]*)\]', line)
      name = re.search(r'op_name="([^"]*)"', line)
      found.append((int(np.prod([int(d) for d in dims.group(1).split(',') if d])),
                    name.group(1) if name else ''))
  return found


def _random_params(model) -> dict:
  """Parameters of the model's shapes drawn by NumPy (no compiled init): N(0, 0.1) each."""
  rng = np.random.default_rng(0)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32)))
  unboxed = jax.tree.map(lambda x: x.unbox() if hasattr(x, 'unbox') else x, shapes['params'],
                         is_leaf=lambda x: hasattr(x, 'unbox'))
  # NumPy arrays: the training step donates its state, so no device buffer is shared with it.
  return jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(x.dtype), unboxed)


def _loss_and_grads(model, params, tokens):
  from bipe_jax.training import train_step  # pylint: disable=g-import-not-at-top

  def loss(p):
    nll, count = train_step.next_token_nll(model.apply({'params': p}, tokens), tokens, PAD)
    return nll / count
  return jax.value_and_grad(loss)(params)


def run_cases() -> dict:
  """Every sharded-vs-unsharded comparison; {case: largest difference (or a count)}.

  Compiles are the cost (~4 s each): every encoding is compared on the context=4 mesh; the
  data=2 x context=4 mesh runs the two bilevel encodings, bipe_alibi through the training
  step itself (plain SGD with learning rate 1, so the update is minus the gradient).
  """
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from bipe_jax.attention import context_parallel  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import train_state  # pylint: disable=g-import-not-at-top
  from bipe_jax.training import train_step  # pylint: disable=g-import-not-at-top
  assert jax.device_count() == 8, jax.devices()
  out = {}
  tokens = jnp.asarray(boundary_tokens())
  meshes = {'c4': _mesh(1, 4), 'd2c4': _mesh(2, 4)}
  table = positions.separator_table(VOCAB, (SEP,))
  kwargs = dict(document_start_table_V=positions.separator_table(VOCAB, (BOS,)), pad_id=PAD)

  # Position streams, computed per shard, against positions.py on the whole rows.
  want = [_streams(positions.bilevel_positions(tokens, table, restart_at_documents=r, **kwargs))
          for r in (False, True)]
  both = lambda t: [context_parallel.global_positions(t, table, restart_at_documents=r, **kwargs)
                    for r in (False, True)]
  for name, mesh in meshes.items():
    with train_state.mesh_context(mesh):
      sharded = jax.device_put(tokens, mesh_lib.batch_sharding(mesh))
      fn = jax.jit(both)
      got = fn(sharded)
      # The jitted call first: calling a Compiled object whose program hoists constants fails
      # in jax 0.10.2; lowering again after the call is a cache hit.
      fn = fn.lower(sharded).compile()
    for restart, g, w in zip((False, True), got, want):
      out[f'positions/{name}/restart={restart}'] = float(np.max(np.abs(_streams(g) - w)))
    out[f'positions_largest_gather/{name}'] = max(
        [0] + [size for size, _ in _all_gathers(fn.as_text())])

  # Fixed-length segments (a K = 5 segment straddles every shard edge) and the hierarchy.
  segments = {'fixed': dict(fixed_segment_length=5),
              'paragraphs': dict(paragraph_table_V=positions.separator_table(VOCAB, (PARA,)))}
  for label, extra in segments.items():
    for r in (False, True):
      want_s = _streams(positions.bilevel_positions(tokens, table, restart_at_documents=r,
                                                    **extra, **kwargs), _ALL_STREAMS)
      with train_state.mesh_context(meshes['c4']):
        got_s = jax.jit(lambda t, r=r, extra=extra: context_parallel.global_positions(
            t, table, restart_at_documents=r, **extra, **kwargs))(
                jax.device_put(tokens, mesh_lib.batch_sharding(meshes['c4'])))
      out[f'segments/{label}/restart={r}'] = float(np.max(np.abs(
          _streams(got_s, _ALL_STREAMS) - want_s)))

  def record(key, loss, grads, compiled, want_loss, want_grads):
    out[f'loss/{key}'] = abs(float(loss) - float(want_loss))
    out[f'grads/{key}'] = _max_diff(grads, want_grads)
    gathers = [op for _, op in _all_gathers(compiled.as_text())]
    out[f'attention_gathers/{key}'] = sum('attention/shard_map' in op for op in gathers)
    out[f'other_gathers/{key}'] = [op for op in gathers if 'shard_map' not in op]

  sgd = optax.sgd(1.0)
  for encoding, impl in ENCODINGS.items():
    model = _model(encoding, impl)
    params = _random_params(model)
    want_loss, want_grads = jax.jit(functools.partial(_loss_and_grads, model))(params, tokens)
    out[f'loss_value/{encoding}'] = float(want_loss)
    out[f'grad_scale/{encoding}'] = max(float(np.max(np.abs(g)))
                                        for g in jax.tree.leaves(want_grads))
    mesh = meshes['c4']
    with train_state.mesh_context(mesh):
      fn = jax.jit(functools.partial(_loss_and_grads, model),
                   in_shardings=(NamedSharding(mesh, P()), mesh_lib.batch_sharding(mesh)))
      result = fn(params, tokens)
      record(f'{encoding}/c4', *result, fn.lower(params, tokens).compile(), want_loss,
             want_grads)
    if encoding == 'bipe_rope':
      mesh = meshes['d2c4']
      with train_state.mesh_context(mesh):
        fn = jax.jit(functools.partial(_loss_and_grads, model),
                     in_shardings=(NamedSharding(mesh, P()), mesh_lib.batch_sharding(mesh)))
        result = fn(params, tokens)
        record(f'{encoding}/d2c4', *result, fn.lower(params, tokens).compile(), want_loss,
               want_grads)
    if encoding == 'bipe_alibi':  # the trainer's step on data=2 x context=4
      mesh = meshes['d2c4']
      _, shardings = train_state.state_shardings(model, sgd, mesh, T)
      state = jax.device_put(train_state.TrainState(
          step=jnp.zeros((), jnp.int32), params=params, opt_state=sgd.init(params),
          rng=jax.random.PRNGKey(0)), shardings)
      step = train_step.make_train_step(model, sgd, lambda _: 1.0, mesh, shardings, pad_id=PAD,
                                        loss_chunk_tokens=0)
      batch = {'tokens': jax.device_put(tokens, mesh_lib.batch_sharding(mesh))}
      with train_state.mesh_context(mesh):
        compiled = step.lower(state, batch).compile()  # for its text; the state is donated
        new_state, metrics = step(state, batch)
      # train_step divides the summed NLL's gradient by the target count: the mean's gradient.
      grads = jax.tree.map(lambda a, b: a - b, params, jax.device_get(new_state.params))
      record(f'{encoding}/d2c4', metrics['loss'], grads, compiled, want_loss, want_grads)
      out['train_step/batch_sharding'] = str(batch['tokens'].sharding.spec)
  return out


@pytest.fixture(scope='module')
def cases() -> dict:
  proc = forkserver.run([sys.executable, os.path.abspath(__file__)], cwd=ROOT, env=cpu_env(8),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # the subprocess on 8 fake devices: make test, not make test-fast
@pytest.mark.parametrize('mesh', ['c4', 'd2c4'])
def test_global_positions_equal_those_of_the_whole_rows(cases, mesh):
  for restart in (False, True):
    assert cases[f'positions/{mesh}/restart={restart}'] == 0
    if mesh == 'c4':  # fixed-length segments and the hierarchy's streams, across shard edges
      assert cases[f'segments/fixed/restart={restart}'] == 0
      assert cases[f'segments/paragraphs/restart={restart}'] == 0
  # Only the per-shard summaries travel: [C, B, 10] int32 at most, never a [B, T] array.
  assert cases[f'positions_largest_gather/{mesh}'] <= CONTEXT * 4 * 10 < 4 * T


@pytest.mark.slow  # the subprocess on 8 fake devices: make test, not make test-fast
@pytest.mark.parametrize('case', [f'{e}/c4' for e in ENCODINGS] +
                         ['bipe_rope/d2c4', 'bipe_alibi/d2c4'])
def test_sharded_losses_and_gradients_equal_unsharded(cases, case):
  encoding = case.split('/')[0]
  assert cases[f'loss/{case}'] < 1e-6 * cases[f'loss_value/{encoding}']
  assert cases[f'grads/{case}'] < 1e-6 + 1e-5 * cases[f'grad_scale/{encoding}']
  assert cases[f'attention_gathers/{case}'] > 0  # the gathered-keys path ran
  # Nothing else is gathered: activations stay sharded over the context axis end to end.
  assert cases[f'other_gathers/{case}'] == []


@pytest.mark.slow  # the subprocess on 8 fake devices: make test, not make test-fast
def test_training_step_shards_batches_over_data_and_context(cases):
  assert cases['train_step/batch_sharding'] == str(
      jax.sharding.PartitionSpec(('data', 'fsdp'), 'context'))


if __name__ == '__main__':
  print(json.dumps(run_cases()))
