"""The library's modules import each other without circles (function-local imports included),
and the data layer never imports a task: generated datasets are found through their registry."""

import ast
import os
import subprocess
import sys

import pytest
from tests import fixtures

ROOT = os.path.join(fixtures.ROOT, 'bipe_jax')


def _modules() -> dict[str, str]:
  mods = {}
  for folder, _, files in os.walk(ROOT):
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        module = os.path.relpath(path[:-3], os.path.dirname(ROOT)).replace(os.sep, '.')
        mods[module.removesuffix('.__init__')] = path
  return mods


def import_graph() -> dict[str, set[str]]:
  """module -> the bipe_jax modules it imports anywhere in its file (top level or in a function)."""
  mods = _modules()
  graph = {}
  for module, path in mods.items():
    targets = set()
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom) and node.module:
        for alias in node.names:
          full = f'{node.module}.{alias.name}'
          targets.add(full if full in mods else node.module)
    graph[module] = {t for t in targets if t in mods and t != module}
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_the_circle_finder_finds_a_circle():
  assert circles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
  assert circles({'a': {'b'}, 'b': set()}) == []


def test_no_import_circles_in_the_library():
  graph = import_graph()
  assert 'bipe_jax.model' in graph['bipe_jax.training.setup']  # the graph sees real imports
  assert circles(graph) == []


def test_the_data_layer_imports_no_task():
  graph = import_graph()
  offenders = {m: sorted(t for t in targets if _layer(t) == 'tasks')
               for m, targets in graph.items() if _layer(m) == 'data'}
  assert {m: t for m, t in offenders.items() if t} == {}


def test_training_and_evaluation_do_not_import_each_other_through_run_restoring():
  """Restoring a run (evaluation, generation, init_from, convert) and scoring blocks (evaluation,
  the trainer's validation) live below both packages: training imports no evaluation module, and
  neither shared module imports evaluation or the trainer."""
  graph = import_graph()
  into_evaluation = {m: sorted(t for t in targets if _layer(t) == 'evaluation')
                     for m, targets in graph.items()
                     if _layer(m) == 'training' or m in ('bipe_jax.runs.restore',
                                                                   'bipe_jax.block_scoring')}
  assert {m: t for m, t in into_evaluation.items() if t} == {}
  assert 'bipe_jax.runs.restore' in graph['bipe_jax.training.init_from']
  assert 'bipe_jax.block_scoring' in graph['bipe_jax.training.validation']
  for shared in ('bipe_jax.runs.restore', 'bipe_jax.block_scoring'):
    assert 'bipe_jax.training.trainer' not in graph[shared]


LAYERS = ('state', 'runs', 'training', 'compile')  # each imports only the layers before it
LEAVES = frozenset({'bipe_jax.storage'})  # imports no bipe_jax module; any layer may


def _layer(module: str) -> str:
  """'bipe_jax.state.mesh' -> 'state'; 'bipe_jax.model' -> 'model'."""
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else ''


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
  """module -> the modules of a later layer of LAYERS it imports (the attention package counts as
  below all of them); LEAVES are exempt."""
  rank = lambda m: LAYERS.index(_layer(m)) if _layer(m) in LAYERS else -1  # pylint: disable=unnecessary-lambda-assignment
  upward = {}
  for module, targets in graph.items():
    if _layer(module) not in LAYERS + ('attention',):
      continue
    for target in sorted(targets - LEAVES):
      if _layer(target) in LAYERS and rank(target) > rank(module):
        upward.setdefault(module, []).append(target)
  return upward


def test_the_layer_rule_finds_an_upward_import():
  graph = {'bipe_jax.state.mesh': {'bipe_jax.runs.restore', 'bipe_jax.storage'},
           'bipe_jax.attention.core': {'bipe_jax.state.mesh'},
           'bipe_jax.runs.restore': {'bipe_jax.state.mesh'},
           'bipe_jax.training.trainer': {'bipe_jax.runs.restore', 'bipe_jax.model'},
           'bipe_jax.model': {'bipe_jax.training.trainer'}}
  assert upward_imports(graph) == {'bipe_jax.state.mesh': ['bipe_jax.runs.restore'],
                                   'bipe_jax.attention.core': ['bipe_jax.state.mesh']}


def test_the_layers_import_only_downwards():
  """state (mesh, train state, optimizer, checkpoints) < runs (a workdir's files, restoring a
  run) < training (the step, the loop, init_from) < compile (ahead-of-time compiles); the
  attention package below all four. runs.storage, the file helper every layer reads
  workdirs with, is a leaf that state's checkpointing uses for the files beside checkpoints."""
  graph = import_graph()
  assert all(graph[leaf] == set() for leaf in LEAVES)
  assert upward_imports(graph) == {}
  assert {m for m, targets in graph.items() if _layer(m) != 'compile'
          and any(_layer(t) == 'compile' for t in targets)} == set()  # compile is the top
  # the graph sees the layers' real imports (so the empty results above mean something)
  assert 'bipe_jax.state.train_state' in graph['bipe_jax.runs.restore']
  assert 'bipe_jax.training.train_step' in graph['bipe_jax.compile.aot']


def test_config_does_not_import_the_model():
  assert 'bipe_jax.model' not in import_graph()['bipe_jax.config']


def test_the_arithmetic_dataset_is_registered_and_unknown_names_are_clear():
  from bipe_jax.data import generated
  from bipe_jax.data import tfds_builders
  assert 'arithmetic' in generated.names()
  assert generated.lookup('arithmetic').make_train_iterator.__module__ == 'bipe_jax.tasks.arithmetic'
  assert generated.lookup('embedded') is None
  with pytest.raises(ValueError, match=r"data.dataset='nope' is not one of .*'arithmetic'"):
    tfds_builders.check_dataset_name('nope')
  with pytest.raises(ValueError, match='already registered'):
    generated.register('arithmetic', generated.GeneratedDataset(len, len, len))


HEAVY = ('grain', 'tensorflow_datasets', 'sentencepiece', 'tensorflow', 'optax', 'orbax',
         'ml_collections')


def _loaded_after(statement: str) -> list[str]:
  """Top-level packages of HEAVY in sys.modules after `statement`, in a fresh interpreter."""
  code = (f'import sys\n{statement}\n'
          f'print(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})))')
  root = os.path.dirname(ROOT)
  env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                       cwd=root, check=True)
  return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_the_model_and_encodings_import_without_the_data_or_training_stack():
  light = _loaded_after('import bipe_jax.positions, bipe_jax.encodings, bipe_jax.attention, '
                        'bipe_jax.model, bipe_jax.config')
  assert light == []
  # The probe sees these packages when they are loaded (so the empty list above means something).
  assert {'grain', 'sentencepiece', 'tensorflow_datasets'} <= set(
      _loaded_after('import bipe_jax.data'))


# A fresh virtualenv with only the core dependencies, simulated: in a fresh interpreter, every
# top-level module that an installed distribution provides is refused unless that distribution
# is one of pyproject.toml's core dependencies or what they require in turn (their metadata's
# requirements, extras and other platforms' markers left out). The standard library and
# bipe_jax itself are not distributions of this venv and stay importable.
_CORE_ONLY = r"""
import importlib.metadata as md, re, sys, tomllib
from packaging.requirements import Requirement
core = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']
norm = lambda name: re.sub(r'[-_.]+', '-', name).lower()
allowed, todo = set(), [Requirement(r) for r in core]
while todo:
  req = todo.pop()
  if req.marker is not None and not req.marker.evaluate({'extra': ''}):
    continue
  name = norm(req.name)
  if name in allowed:
    continue
  allowed.add(name)
  todo += [Requirement(r) for r in md.requires(name) or ()]
providers = md.packages_distributions()
class CoreOnly:
  @staticmethod
  def find_spec(name, path=None, target=None):
    dists = {norm(d) for d in providers.get(name.split('.')[0], ())}
    if dists and not dists & allowed and 'bipe-jax' not in dists:
      raise ModuleNotFoundError(f'{name} is not a core dependency', name=name)
sys.meta_path.insert(0, CoreOnly)
try:
  exec(sys.argv[1])
  print('ok')
except ImportError as e:
  print('ImportError', e.name)
"""


def _with_core_only(statement: str) -> str:
  out = subprocess.run([sys.executable, '-c', _CORE_ONLY, statement], capture_output=True,
                       text=True, cwd=os.path.dirname(ROOT),
                       env=dict(os.environ, JAX_PLATFORMS='cpu'),
                       check=True)
  return out.stdout.strip().splitlines()[-1]


def test_the_four_modules_import_with_only_the_core_dependencies_installed():
  assert _with_core_only('import bipe_jax.positions, bipe_jax.encodings, bipe_jax.attention, '
                         'bipe_jax.model') == 'ok'
  # the simulation refuses what is not core (so 'ok' above means something)
  assert _with_core_only('import bipe_jax.data') in {'ImportError grain', 'ImportError '
                                                    'sentencepiece', 'ImportError tensorflow_datasets'}


def test_the_library_reads_its_defaults_from_itself():
  """No bipe_jax module edits sys.path or imports the presets' `configs` package: the defaults
  live in bipe_jax.defaults (configs/base.py re-exports them for the presets)."""
  offenders = []
  for module, path in _modules().items():
    with open(path) as f:
      source = f.read()
    tree = ast.parse(source)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    if 'sys.path' in source or any(m.split('.')[0] == 'configs' for m in imported):
      offenders.append(module)
  assert offenders == []
  from bipe_jax import defaults  # pylint: disable=g-import-not-at-top
  from configs import base  # pylint: disable=g-import-not-at-top
  assert base.get_base_config().to_dict() == defaults.get_base_config().to_dict()
