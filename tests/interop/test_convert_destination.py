"""`convert` checks its destination before it reads or writes anything, in both directions: an
existing training workdir or model folder is refused and left byte for byte as it was."""

import json
import os

import pytest

from bipe_jax.interop import convert
from bipe_jax.interop import destination


def _snapshot(folder):
  """{relative path: bytes} of every file under `folder`."""
  out = {}
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, folder)] = f.read()
  return out


def _training_workdir(path):
  """What train/main.py leaves: config.json with a model section, a checkpoint folder."""
  os.makedirs(os.path.join(path, 'checkpoints', '20'))
  with open(os.path.join(path, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump({'model': {'position_encoding': 'rope'}, 'data': {'seq_len': 64}}, f)
  with open(os.path.join(path, 'checkpoints', '20', 'state'), 'wb') as f:
    f.write(b'weights')
  return str(path)


def _hf_folder(path):
  os.makedirs(path)
  with open(os.path.join(path, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump({'hidden_size': 32, 'model_type': 'llama'}, f)
  return str(path)


@pytest.mark.parametrize('direction', ['hf_to_bipe', 'bipe_to_hf'])
def test_a_non_empty_destination_is_refused_before_anything_is_written(tmp_path, capsys,
                                                                        direction):
  victim = _training_workdir(tmp_path / 'victim')
  src = (_hf_folder(tmp_path / 'hf') if direction == 'hf_to_bipe'
         else _training_workdir(tmp_path / 'run'))
  before = _snapshot(victim)
  assert convert.main(['--from', src, '--to', victim]) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'already exists and is not empty' in err and '--overwrite' in err
  assert _snapshot(victim) == before
  # The library functions refuse the same way (checked before the source is even read).
  function = convert.hf_to_workdir if direction == 'hf_to_bipe' else convert.workdir_to_hf
  with pytest.raises(ValueError, match='not empty'):
    function(src, victim)
  assert _snapshot(victim) == before


def test_new_and_empty_destinations_are_accepted_and_the_source_never(tmp_path):
  src = _training_workdir(tmp_path / 'run')
  (tmp_path / 'empty').mkdir()
  destination.check_destination(str(tmp_path / 'empty'), src)
  destination.check_destination(str(tmp_path / 'new' / 'deeper'), src)
  for dst in (src, str(tmp_path)):  # the source itself, or a folder holding it
    with pytest.raises(ValueError, match='is the source'):
      destination.check_destination(dst, src, overwrite=True)
  (tmp_path / 'file').write_text('')
  with pytest.raises(ValueError, match='is a file, not a directory'):
    destination.check_destination(str(tmp_path / 'file'), src, overwrite=True)


def test_overwrite_clears_the_destination_only_when_asked(tmp_path):
  victim = _training_workdir(tmp_path / 'victim')
  destination.check_destination(victim, str(tmp_path / 'hf'), overwrite=True)  # no error
  assert _snapshot(victim)  # checking removes nothing
  destination.clear_destination(victim)
  assert os.path.isdir(victim) and not os.listdir(victim)
