"""bipe_jax.kernels: the portable and cpu paths compute the same losses and gradients for every
hook of the schemes (tests/scheme_cover.py: 14 schemes that between them use every input,
rotary, bias and transform kind); 'auto' resolves by the platform of the devices the step runs
on."""

import dataclasses
import functools
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bipe_jax import config as config_lib
from bipe_jax import kernels
from bipe_jax import platform_choices
from bipe_jax.config import ModelConfig
from bipe_jax.kernels import process_setup
from bipe_jax.model import Transformer
from bipe_jax.training import chunked_loss
from bipe_jax.training import train_step
from tests import fixtures
from tests import forkserver
from tests.scheme_cover import HOOK_COVER

ROOT = fixtures.ROOT
B, T, V = 2, 16, 48
SEP, BOS = (3, 5), 1
TINY = ModelConfig(vocab_size=V, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                   ffn_size=64, max_intra=16, max_position=32, train_length=16,
                   separator_ids=SEP, bos_id=BOS, attention_impl='dense', fire_hidden=8,
                   dape_hidden=8, t5_buckets=8, t5_max_distance=16)


def _tokens():
  """Random ids in [6, V) with separators about every 4 tokens (so BiPE has segments)."""
  rng = np.random.default_rng(0)
  tok = rng.integers(6, V, size=(B, T))
  seps = rng.random((B, T)) < 0.25
  tok[seps] = rng.choice(SEP, size=int(seps.sum()))
  return jnp.asarray(tok, jnp.int32)


def _loss(cfg: ModelConfig, params, tokens):
  """The training loss (hidden states into the chunked head + loss, two chunks) of `cfg`."""
  hidden = Transformer(cfg).apply({'params': params}, tokens, return_hidden=True)
  targets, valid = train_step.scored_targets(tokens)
  return chunked_loss.lm_head_nll_sum(hidden, params['lm_head']['kernel'], targets,
                                      valid.astype(jnp.float32), T // 2, cfg.compute_dtype,
                                      cfg.kernels) / jnp.sum(valid)


@functools.lru_cache(maxsize=None)
def _both_paths() -> dict:
  """{encoding: {'portable' | 'cpu': (loss, grads)}} for every encoding, from ONE compiled
  program (one compile of 17 models costs about half of 17 compiles), the parameters
  initialised inside it."""

  @jax.jit
  def all_encodings(tokens):
    out = {}
    for name in HOOK_COVER:
      cfg = config_lib.validate_model_config(dataclasses.replace(TINY, position_encoding=name))
      params = nn.meta.unbox(Transformer(cfg).init(jax.random.PRNGKey(0), tokens)['params'])
      out[name] = {k: jax.value_and_grad(_loss, argnums=1)(
          dataclasses.replace(cfg, kernels=k), params, tokens) for k in ('portable', 'cpu')}
    return out

  return jax.device_get(all_encodings(_tokens()))


def _differences(out: dict) -> list[str]:
  """What differs between the two paths' (loss, grads) of one encoding, beyond float rounding."""
  (loss_p, grads_p), (loss_c, grads_c) = out['portable'], out['cpu']
  if not (np.isfinite(loss_p) and 2.0 < loss_p < 6.0):  # about log(V) = 3.9 at init
    return [f'portable loss {loss_p}']
  found = [] if np.isclose(loss_p, loss_c, rtol=1e-6, atol=0) else [f'loss {loss_p} {loss_c}']
  flat_p = jax.tree_util.tree_leaves_with_path(grads_p)
  flat_c = jax.tree.leaves(grads_c)
  scale = max(float(np.max(np.abs(g))) for g in flat_c)  # (FIRE's output bias gets ~0)
  for (path, g_p), g_c in zip(flat_p, flat_c, strict=True):
    if not np.allclose(g_p, g_c, rtol=1e-4, atol=1e-6 * scale):
      found.append(f'{jax.tree_util.keystr(path)} max diff {np.max(np.abs(g_p - g_c)):.3g}')
  return found


def test_portable_and_cpu_paths_give_the_same_loss_and_gradients():
  """Every hook (HOOK_COVER's schemes), 1 layer, dense attention (the seam's softmax core), the
  chunked training loss: one test (and one compile) so that pytest-xdist workers do not each
  compile it."""
  everything = _both_paths()
  assert sorted(everything) == sorted(HOOK_COVER)
  failures = {name: d for name, out in everything.items() if (d := _differences(out))}
  assert not failures, failures


@pytest.mark.parametrize('platform, expected', [('cpu', 'cpu'), ('tpu', 'portable'),
                                                ('gpu', 'portable'), ('cuda', 'portable')])
def test_auto_resolves_to_cpu_only_on_cpu_devices(platform, expected):
  assert kernels.resolve_kernels('auto', platform) == expected
  assert kernels.resolve_kernels('portable', platform) == 'portable'
  assert kernels.resolve_kernels('cpu', platform) == 'cpu'


def test_a_bad_name_is_one_clear_error():
  with pytest.raises(ValueError, match=r"model.kernels='gpu' is invalid"):
    kernels.resolve_kernels('gpu', 'cpu')
  with pytest.raises(ValueError, match='model.kernels'):
    config_lib.validate_model_config(dataclasses.replace(TINY, kernels='fast'))


SHARD_MAP_GRADIENT = '''
import dataclasses
import flax.linen as nn
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
from tests.kernels import test_kernels as tk
tokens = jnp.tile(tk._tokens(), (2, 1))  # [4, T]: one row per device
mesh = Mesh(np.array(jax.devices()), ('data',))
for name in ('portable', 'cpu'):
  cfg = dataclasses.replace(tk.TINY, position_encoding='bipe_rope', kernels=name)
  params = nn.meta.unbox(jax.jit(tk.Transformer(cfg).init)(jax.random.PRNGKey(0), tokens))
  loss_sum = lambda p, t: tk._loss(cfg, p, t) * jnp.sum(tk.train_step.scored_targets(t)[1])
  per_device = jax.shard_map(lambda p, t: jax.grad(loss_sum)(p, t), mesh=mesh,
                             in_specs=(P(), P('data')), out_specs=P())  # check_vma=True
  try:
    got = jax.jit(per_device)(params['params'], tokens)
  except ValueError as e:
    print(name, 'ERROR', str(e).splitlines()[0])
    continue
  want = jax.jit(jax.grad(loss_sum))(params['params'], tokens)
  print(name, 'MAXERR', max(float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
                            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))))
'''


def test_grad_inside_shard_map_works_on_the_portable_path():
  """What a user writing their own parallel step does: jax.grad of the model's training loss
  (chunked head + loss) inside jax.shard_map with its default check_vma=True, the batch split
  over 4 CPU devices (a subprocess: the device count is set before JAX starts), replicated
  parameters: equals the gradient of the whole batch. The cpu path's weight-gradient primitive
  has no varying-axes rule, which is why the portable path exists."""
  env = dict(os.environ, XLA_FLAGS=f'{os.environ.get("XLA_FLAGS", "")} '
             '--xla_force_host_platform_device_count=4', JAX_PLATFORMS='cpu', PYTHONPATH=ROOT)
  proc = forkserver.run([sys.executable, '-c', SHARD_MAP_GRADIENT], capture_output=True,
                        text=True, env=env, cwd=ROOT, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = dict(line.split(' ', 1) for line in proc.stdout.strip().splitlines())
  assert lines['portable'].startswith('MAXERR'), proc.stdout
  assert float(lines['portable'].split()[1]) < 1e-5, proc.stdout
  assert lines['cpu'].startswith('ERROR Expected cotangent type'), proc.stdout


def test_auto_lowers_the_portable_forms_for_a_tpu_topology(monkeypatch):
  """model.kernels='auto' compiled on this CPU host for TPU v5e 2x2 (data x fsdp mesh) resolves
  to the portable path by the mesh's devices: the lowered training-loss gradient has no
  optimization barrier and computes RoPE's sin / cos itself; the cpu path's program (forced)
  has the barriers and no sin / cos (so the checks can fail)."""
  pytest.importorskip('libtpu')
  monkeypatch.setenv('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')  # other processes may hold libtpu
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  devices = topologies.get_topology_desc(platform='tpu', topology_name='v5e:2x2').devices
  mesh = jax.sharding.Mesh(np.array(devices).reshape(2, 2), ('data', 'fsdp'))
  tokens = jax.ShapeDtypeStruct((B * 2, T), jnp.int32)

  def lowered(name: str) -> str:
    cfg = platform_choices.config_for_mesh(dataclasses.replace(
        TINY, position_encoding='bipe_rope', kernels=name), mesh)
    params = jax.eval_shape(lambda t: nn.meta.unbox(
        Transformer(cfg).init(jax.random.PRNGKey(0), t)['params']), tokens)
    shard = lambda spec: jax.sharding.NamedSharding(mesh, spec)
    step = jax.jit(jax.value_and_grad(functools.partial(_loss, cfg)),
                   in_shardings=(shard(P()), shard(P(('data', 'fsdp')))))
    return cfg.kernels, step.lower(params, tokens).as_text()

  resolved, portable = lowered('auto')
  assert resolved == 'portable'
  assert 'optimization_barrier' not in portable
  assert 'stablehlo.sine' in portable and 'stablehlo.cosine' in portable
  resolved, cpu = lowered('cpu')
  assert resolved == 'cpu' and 'optimization_barrier' in cpu and 'stablehlo.sine' not in cpu


@pytest.mark.parametrize('environ, platform', [({'JAX_PLATFORMS': 'cpu'}, 'cpu'),
                                               ({'JAX_PLATFORMS': 'tpu,cpu'}, 'tpu'),
                                               ({'JAX_PLATFORMS': 'cuda'}, 'gpu')])
def test_the_process_platform_is_judged_before_jax_starts(environ, platform):
  assert process_setup.expected_platform(environ) == platform


def test_the_cpu_process_setup_follows_the_kernels_decision(monkeypatch):
  calls = []
  monkeypatch.setattr(process_setup.host_malloc, 'keep_freed_memory',
                      lambda environ=None: calls.append('malloc'))
  monkeypatch.setattr(process_setup.cpu_devices_lib, 'use_cpu_devices',
                      lambda count, environ=None: calls.append(f'devices={count}'))
  cpu_host, tpu_host = {'JAX_PLATFORMS': 'cpu'}, {'JAX_PLATFORMS': 'tpu'}
  assert process_setup.setup_process('auto', 2, cpu_host) == 'cpu'
  assert calls == ['malloc', 'devices=2']
  calls.clear()
  assert process_setup.setup_process('auto', 2, tpu_host) == 'portable'  # inert off CPU
  assert process_setup.setup_process('portable', 1, cpu_host) == 'portable'
  assert not calls
  with pytest.raises(ValueError, match=r"--cpu_devices=2 .* model.kernels='portable'"):
    process_setup.setup_process('portable', 2, cpu_host)
  assert process_setup.setup_process('cpu', 1, tpu_host) == 'cpu'  # asked for explicitly
  assert calls == ['malloc', 'devices=1']
