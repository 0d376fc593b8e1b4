"""Installs into this Python's environment what `pip install ARGS` would: with uv where it works,
else with pip (what `make setup` runs for each pinned requirements file).

    .venv/bin/python tools/install_requirements.py -r requirements.txt
    .venv/bin/python tools/install_requirements.py --no-build-isolation -c requirements.txt -e '.[tests]'
    .venv/bin/python tools/install_requirements.py --python OTHER/bin/python dist/bipe_jax-*.whl

`--python PATH` (first) installs into the environment of that interpreter instead.

uv (installed beside pip by the Makefile, pinned there) resolves and unpacks the same pinned files
several times faster than pip: on the 2-core machine requirements.txt took 7 s against pip's
33 s, and requirements-interop.txt (PyTorch, Transformers) 5 s against ~25 s. uv does not read
pip's configuration, so the settings pip would use (`pip config list`: the index, extra indexes,
find-links folders and a constraints file, from pip.conf files or PIP_* variables) are passed
on; a local folder or file that does not exist is left out. Where uv is missing or fails, pip
installs the same ARGS (`--no-compile`: the Makefile byte-compiles the environment once).
"""

import os
import shlex
import subprocess
import sys

# pip setting -> uv flag; multi-valued settings are space-separated in pip's configuration
SETTINGS = {'index-url': '--index-url', 'extra-index-url': '--extra-index-url',
            'find-links': '--find-links', 'constraint': '--constraint'}
MULTI = {'extra-index-url', 'find-links', 'constraint'}


def pip_settings() -> dict:
  """{setting: [values]} of pip's effective configuration (files, then PIP_* variables)."""
  out = subprocess.run([sys.executable, '-m', 'pip', 'config', 'list'], capture_output=True,
                       text=True, check=False).stdout
  settings = {}
  for line in out.splitlines():  # global.find-links='/opt/wheels' or :env:.find-links='...'
    key, _, value = line.partition('=')
    name = key.rsplit('.', 1)[-1]
    if name in SETTINGS:
      values = shlex.split(value)
      values = (values[0].split() if name in MULTI else values[:1]) if values else []
      settings[name] = values  # later lines (the environment) win, as in pip
  return settings


def _exists(location: str) -> bool:
  """False for a local path (or file:// URL) that is not there; True for remote URLs."""
  if location.startswith('file://'):
    return os.path.exists(location[len('file://'):])
  if '://' in location:
    return True
  return os.path.exists(location)


def uv_arguments(settings: dict) -> list:
  """The uv flags that give uv pip's indexes, find-links and constraints."""
  args = []
  for name, flag in SETTINGS.items():
    for value in settings.get(name, []):
      if _exists(value):
        args += [flag, value]
  return args


def main(argv: list) -> int:
  target = sys.executable
  if argv[:1] == ['--python']:
    target, argv = argv[1], argv[2:]
  uv = os.path.join(os.path.dirname(sys.executable), 'uv')
  if os.path.exists(uv):
    command = [uv, 'pip', 'install', '--quiet', '--python', target, '--link-mode=copy',
               '--index-strategy', 'unsafe-best-match', *uv_arguments(pip_settings()), *argv]
    if subprocess.run(command, check=False).returncode == 0:
      return 0
    print('install_requirements: uv failed (above); installing with pip', file=sys.stderr)
  return subprocess.run([sys.executable, '-m', 'pip', '--python', target, 'install', '-qq',
                         '--no-compile', *argv], check=False).returncode


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
