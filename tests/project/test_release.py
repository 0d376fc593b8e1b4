"""Release basics: a licence, one version everywhere, a changelog, and a wheel that installs in a
fresh virtualenv with the core dependencies only (pyproject's `dependencies`) and imports."""

import os
import shutil
import subprocess
import sys
import tomllib

import pytest

import bipe_jax
from tests import fixtures

ROOT = fixtures.ROOT
PYPROJECT = tomllib.load(open(os.path.join(ROOT, 'pyproject.toml'), 'rb'))['project']


def test_the_version_is_the_same_in_the_package_pyproject_and_changelog():
  assert bipe_jax.__version__ == PYPROJECT['version']
  with open(os.path.join(ROOT, 'CHANGELOG.md'), encoding='utf-8') as f:
    assert f'## {bipe_jax.__version__}' in f.read()


def test_the_licence_is_declared_and_shipped():
  assert PYPROJECT['license'] == 'Apache-2.0' and PYPROJECT['license-files'] == ['LICENSE']
  with open(os.path.join(ROOT, 'LICENSE'), encoding='utf-8') as f:
    text = f.read()
  assert 'Apache License' in text and 'Version 2.0, January 2004' in text


@pytest.mark.slow
def test_the_wheel_installs_with_the_core_dependencies_only_and_imports(tmp_path):
  # Build from a copy of what the wheel is made of, so nothing (build/, *.egg-info) is left in
  # the checkout; --no-isolation uses this environment's setuptools (nothing downloaded).
  source = tmp_path / 'source'
  shutil.copytree(os.path.join(ROOT, 'bipe_jax'), source / 'bipe_jax',
                  ignore=shutil.ignore_patterns('__pycache__'))
  for name in ('pyproject.toml', 'README.md', 'LICENSE'):
    shutil.copyfile(os.path.join(ROOT, name), source / name)
  subprocess.run([sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--outdir',
                  str(tmp_path / 'dist'), str(source)], check=True, capture_output=True)
  wheel, = (tmp_path / 'dist').iterdir()
  assert wheel.name == f'bipe_jax-{bipe_jax.__version__}-py3-none-any.whl'

  # A fresh virtualenv without pip: the set-up's installer (uv, else this environment's pip)
  # installs into it the wheel with its core dependencies only (no extras), from the package
  # index pip is configured with, without compiling .pyc files.
  venv = tmp_path / 'venv'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
  python = str(venv / 'bin' / 'python')
  subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'install_requirements.py'),
                  '--python', python, str(wheel)], check=True, capture_output=True)
  installed = subprocess.run(
      [python, '-c', 'import importlib.metadata as md; print(sorted(d.metadata["Name"].lower() '
       'for d in md.distributions()))'], check=True, capture_output=True, text=True).stdout
  for extra in ('grain', 'sentencepiece', 'tensorflow-datasets', 'torch', 'libtpu'):
    assert f"'{extra}'" not in installed, extra  # only the core dependencies came with it
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  proc = subprocess.run(
      [python, '-c', 'import bipe_jax, bipe_jax.model, bipe_jax.encodings; '
       'print(bipe_jax.__version__, bipe_jax.__file__)'],
      cwd=str(tmp_path), env=env, check=True, capture_output=True, text=True)
  version, path = proc.stdout.split()
  assert version == bipe_jax.__version__ and path.startswith(str(venv))
