"""tools/install_requirements.py (what `make setup` installs with): pip's settings handed to uv."""

import importlib.util
import os

from tests import fixtures


def _tool():
  spec = importlib.util.spec_from_file_location(
      'install_requirements', os.path.join(fixtures.ROOT, 'tools', 'install_requirements.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_pip_settings_reach_uv_and_missing_local_places_are_left_out(tmp_path):
  tool = _tool()
  wheels, constraints = tmp_path / 'wheels', tmp_path / 'constraints.txt'
  wheels.mkdir()
  constraints.write_text('torch<=2.14.1\n')
  settings = {'index-url': ['https://pypi.example/simple'],
              'extra-index-url': [f'file://{tmp_path}', f'file://{tmp_path}/gone'],
              'find-links': [str(wheels), str(tmp_path / 'nowhere')],
              'constraint': [str(constraints)]}
  assert tool.uv_arguments(settings) == [
      '--index-url', 'https://pypi.example/simple', '--extra-index-url', f'file://{tmp_path}',
      '--find-links', str(wheels), '--constraint', str(constraints)]


def test_pip_settings_are_read_from_pip_config_list(monkeypatch):
  tool = _tool()
  listing = ("global.extra-index-url='file:///a/simple file:///b/simple'\n"
             "global.find-links='/opt/wheels'\n"
             "global.cert='/etc/ssl/certs/ca.crt'\n"
             ":env:.find-links='/srv/wheels'\n")

  class Done:  # what subprocess.run returns
    stdout = listing

  monkeypatch.setattr(tool.subprocess, 'run', lambda *a, **k: Done())
  assert tool.pip_settings() == {'extra-index-url': ['file:///a/simple', 'file:///b/simple'],
                                 'find-links': ['/srv/wheels']}  # the environment wins
