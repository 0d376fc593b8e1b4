"""The library's modules import each other without circles (function-local imports included),
and each layer imports only the layers above it in docs/layout.md, the one place that order
is written: storage at the bottom of the house, the command-line programs' logic on top."""

import ast
import os
import re
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


LAYOUT = os.path.join(fixtures.ROOT, 'docs', 'layout.md')
# Imports that go upward in docs/layout.md's order, each with the reason it stays: none.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def layer_order(markdown: str) -> list[str]:
  """The layers of bipe_jax in docs/layout.md's order: the names of the entries `  NAME.py` /
  `  NAME/` (two spaces in) under the line `bipe_jax/` of its first code block, up to the next
  unindented line ('__init__.py' -> '__init__')."""
  block = re.search(r'^```\n(.*?)^```', markdown, re.S | re.M)
  if block is None:
    raise ValueError('docs/layout.md has no code block with the layout')
  order, inside = [], False
  for line in block.group(1).splitlines():
    if line.startswith('bipe_jax/'):
      inside = True
    elif inside and line and not line.startswith(' '):
      break
    elif inside and (entry := re.match(r'  (\w+)(\.py|/)(\s|$)', line)):
      order.append(entry.group(1))
  return order


def _layer(module: str) -> str:
  """'bipe_jax.state.mesh' -> 'state'; 'bipe_jax.model' -> 'model'; 'bipe_jax' -> '__init__'."""
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else '__init__'


def upward_imports(graph: dict[str, set[str]], order: list[str]) -> dict[str, list[str]]:
  """module -> the modules of a layer after its own in `order` that it imports (less
  ALLOWED_UPWARD)."""
  rank = {layer: i for i, layer in enumerate(order)}
  place = lambda m: rank.get(_layer(m), len(order))  # pylint: disable=unnecessary-lambda-assignment
  upward = {}  # (a module the order does not place counts as the top)
  for module, targets in graph.items():
    for target in sorted(targets):
      if (place(target) > place(module)
          and (module, target) not in ALLOWED_UPWARD):
        upward.setdefault(module, []).append(target)
  return upward


def test_the_layout_parser_reads_the_entries_in_order():
  markdown = ('text\n```\nbipe_jax/   the library\n  storage.py    files\n'
              '                continued: not an entry\n  __init__.py   x\n  state/   y\n'
              '    nested.py   not a layer\nconfigs/   presets\n  tiny.py   not bipe_jax\n```\n')
  assert layer_order(markdown) == ['storage', '__init__', 'state']


def test_the_layer_rule_finds_an_upward_import():
  order = ['storage', 'state', 'runs', 'training']
  graph = {'bipe_jax.state.mesh': {'bipe_jax.runs.restore', 'bipe_jax.storage'},
           'bipe_jax.storage': set(),
           'bipe_jax.runs.restore': {'bipe_jax.state.mesh', 'bipe_jax.runs.tokenizer'},
           'bipe_jax.runs.tokenizer': {'bipe_jax.runs.restore'},  # one layer: not upward
           'bipe_jax.training.trainer': {'bipe_jax.runs.restore', 'bipe_jax.storage'}}
  assert upward_imports(graph, order) == {'bipe_jax.state.mesh': ['bipe_jax.runs.restore']}


def test_docs_layout_places_every_module_of_the_library_once():
  with open(LAYOUT, encoding='utf-8') as f:
    order = layer_order(f.read())
  assert len(order) == len(set(order)), [n for n in order if order.count(n) > 1]
  layers = {_layer(m) for m in import_graph()}
  assert sorted(layers - set(order)) == []  # a module docs/layout.md does not place
  assert sorted(set(order) - layers) == []  # an entry naming no module
  assert order[0] == 'storage'  # the bottom of the house: imports nothing of the library


def test_every_import_goes_to_a_layer_above_in_docs_layout():
  """Each entry of docs/layout.md's bipe_jax/ list imports only the entries above it (its own
  modules among themselves: no circles, test_no_import_circles_in_the_library)."""
  with open(LAYOUT, encoding='utf-8') as f:
    order = layer_order(f.read())
  graph = import_graph()
  assert upward_imports(graph, order) == {}
  # the graph sees the layers' real imports (so the empty result above means something)
  assert 'bipe_jax.state.train_state' in graph['bipe_jax.runs.restore']
  assert 'bipe_jax.training.train_step' in graph['bipe_jax.compile.aot']
  assert 'bipe_jax.storage' in graph['bipe_jax.state.checkpointing']
  assert 'bipe_jax.data.preparation' in graph['bipe_jax.runs.tokenizer']  # in a function
  assert all(_layer(t) == 'platforms' for t in graph['bipe_jax'])


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
