"""Cheaper CHE cells: a training batch is padded only to the smallest bucket that holds it
(bipe_jax/che/training.py), which changes neither the loss nor its gradients; compiled
programs are shared by the cells of one process whose models are equal."""

import jax
import numpy as np
import pytest

from bipe_jax.che import batches
from bipe_jax.che import model as che_model
from bipe_jax.che import scoring
from bipe_jax.che import training
from bipe_jax.tasks import che as tasks

TINY = dict(num_layers=1, hidden_size=16, num_heads=2)


def test_padded_shape_is_the_smallest_bucket_up_to_the_longest_row():
  task = tasks.get_task('reverse_string')  # a row of length n: n inputs + n outputs
  shape = lambda n, b=32: training.padded_shape(task, n, 40, b)
  assert shape(1) == (32, 32) and shape(16) == (32, 32) and shape(17) == (64, 32)
  assert shape(32) == (64, 32) and shape(33) == (80, 40) and shape(40) == (80, 40)
  assert {shape(n) for n in range(1, 41)} == {(32, 32), (64, 32), (80, 40)}  # three programs
  assert shape(5, 1) == (10, 5)  # bucket 1: the row itself
  for n in range(1, 41):  # every row fits its shape
    batches.pack(task, [task.sample(np.random.default_rng(n), 2, n)], 'task', *shape(n))
  with pytest.raises(ValueError, match='bucket=0'):
    shape(3, 0)


@pytest.mark.parametrize('architecture', ['project', 'peer'])
def test_padding_changes_neither_the_loss_nor_its_gradients(architecture):
  task = tasks.get_task('duplicate_string')  # a row of length n: n inputs + 2n outputs
  cfg = che_model.che_model_config(task, 'rope', max_tokens=160, **TINY)
  module = che_model.build_module(cfg, task, architecture)
  params = che_model.init_params(module, 0)
  b = task.sample(np.random.default_rng(0), 4, 7)  # 21 tokens, 14 outputs
  loss_and_grads = jax.jit(jax.value_and_grad(
      lambda p, batch: training.batch_loss(module, p, batch, task.output_size)))
  small = batches.pack(task, [b], 'task', *training.padded_shape(task, 7, 40))
  large = batches.pack(task, [b], 'task', 120, 80)  # the longest training row's shape
  assert small['tokens'].shape == (4, 32) and small['targets'].shape == (4, 32)
  (l_small, g_small), (l_large, g_large) = loss_and_grads(params, small), loss_and_grads(
      params, large)
  np.testing.assert_allclose(l_small, l_large, rtol=1e-6, atol=1e-6)
  for a, c in zip(jax.tree.leaves(g_small), jax.tree.leaves(g_large)):
    np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-6)
  assert max(float(np.abs(a).max()) for a in jax.tree.leaves(g_small)) > 1e-3  # not all zero


def test_models_equal_across_cells_share_their_compiled_programs():
  """Train steps and predictors are cached per model for a whole grid (more models than a
  grid of 3 tasks x 8 encodings holds), so a seed-major grid reuses them too."""
  task = tasks.get_task('parity_check')
  make = lambda e: che_model.build_module(
      che_model.che_model_config(task, e, max_tokens=64, **TINY), task, 'peer')
  first = training.train_step(make('rope'), 2, 1e-3)
  for e in ('alibi', 'kerple', 'fire', 'nope', 't5', 'learned', 'sinusoidal', 'bipe_rope'):
    training.train_step(make(e), 2, 1e-3)  # more models than the old cache of 4 held
  assert training.train_step(make('rope'), 2, 1e-3) is first
  assert training.train_step(make('rope'), 2, 3e-3) is not first
  predict = scoring._predict  # pylint: disable=protected-access
  assert predict(make('rope'), 2) is predict(make('rope'), 2)
  assert training.train_step.cache_info().maxsize >= 24
  assert predict.cache_info().maxsize >= 24


def test_tasks_of_one_vocabulary_share_the_compiled_step():
  """Reverse and duplicate string (3 symbols, 2 classes) build equal models for an encoding
  without learned tables, although their rows bound different sizes: the second task's batches
  of an already compiled shape compile nothing."""
  rev, dup = tasks.get_task('reverse_string'), tasks.get_task('duplicate_string')
  config = lambda task, e, n: che_model.che_model_config(task, e, max_tokens=n, **TINY)
  assert config(rev, 'rope', 1064) == config(dup, 'rope', 1564)
  assert config(rev, 'learned', 1064) != config(dup, 'learned', 1564)  # its table's rows
  module = che_model.build_module(config(rev, 'rope', 1064), rev)
  params = che_model.init_params(module, 0)
  tx, step = training.train_step(module, 2, 1e-3)
  key = jax.random.PRNGKey(0)
  step(params, tx.init(params), batches.pack(rev, [rev.sample(np.random.default_rng(0), 4, 9)],
                                             'task', *training.padded_shape(rev, 9, 40)), key)
  compiled = step._cache_size()  # pylint: disable=protected-access
  tx2, step2 = training.train_step(che_model.build_module(config(dup, 'rope', 1564), dup), 2, 1e-3)
  assert step2 is step
  dup_batch = batches.pack(dup, [dup.sample(np.random.default_rng(0), 4, 5)], 'task',
                           *training.padded_shape(dup, 5, 40))
  assert dup_batch['tokens'].shape == (4, 32) and dup_batch['targets'].shape == (4, 32)
  step2(params, tx2.init(params), dup_batch, key)
  assert step._cache_size() == compiled  # pylint: disable=protected-access
