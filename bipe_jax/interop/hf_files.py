"""Reading and writing Hugging Face model folders: `config.json` plus weight files.

Weights are read tensor by tensor into float32 NumPy arrays:
- `model.safetensors`, or shards listed in `model.safetensors.index.json` (no PyTorch needed);
- `pytorch_model.bin`, or shards listed in `pytorch_model.bin.index.json` (needs PyTorch; a clear
  error says so when it is missing).
Writing always produces one `model.safetensors` (no PyTorch needed).
"""

from __future__ import annotations

import json
import os
from typing import Dict

import numpy as np

CONFIG_NAME = 'config.json'
SAFETENSORS_NAME = 'model.safetensors'
SAFETENSORS_INDEX = 'model.safetensors.index.json'
TORCH_NAME = 'pytorch_model.bin'
TORCH_INDEX = 'pytorch_model.bin.index.json'


def read_hf_config(folder: str) -> dict:
  """Returns the parsed `config.json` of a Hugging Face model folder."""
  path = os.path.join(folder, CONFIG_NAME)
  if not os.path.isfile(path):
    raise ValueError(f'not a Hugging Face model folder: {folder!r} has no {CONFIG_NAME}')
  with open(path) as f:
    return json.load(f)


def _shard_files(folder: str, index_name: str) -> list:
  with open(os.path.join(folder, index_name)) as f:
    weight_map = json.load(f)['weight_map']
  return sorted(set(weight_map.values()))


def weight_files(folder: str) -> tuple:
  """Returns ('safetensors' | 'torch', [file paths]) for the weights in `folder`.

  safetensors is preferred when both formats are present (it needs no PyTorch).
  """
  def exists(name):
    return os.path.isfile(os.path.join(folder, name))
  if exists(SAFETENSORS_NAME):
    return 'safetensors', [os.path.join(folder, SAFETENSORS_NAME)]
  if exists(SAFETENSORS_INDEX):
    return 'safetensors', [os.path.join(folder, n) for n in _shard_files(folder, SAFETENSORS_INDEX)]
  if exists(TORCH_NAME):
    return 'torch', [os.path.join(folder, TORCH_NAME)]
  if exists(TORCH_INDEX):
    return 'torch', [os.path.join(folder, n) for n in _shard_files(folder, TORCH_INDEX)]
  raise ValueError(
      f'no weights in {folder!r}: expected {SAFETENSORS_NAME}, {SAFETENSORS_INDEX}, '
      f'{TORCH_NAME} or {TORCH_INDEX}')


def _read_safetensors(path: str) -> Dict[str, np.ndarray]:
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  out = {}
  with safe_open(path, framework='numpy') as f:
    for name in f.keys():
      out[name] = np.asarray(f.get_tensor(name), dtype=np.float32)
  return out


def _read_torch_bin(path: str) -> Dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        f'{path} is a PyTorch pickle (.bin): reading it needs PyTorch, which is not installed. '
        'Install it (pip install -r requirements-interop.txt) or convert the folder to '
        'safetensors first (then no PyTorch is needed).') from e
  state = torch.load(path, map_location='cpu', weights_only=True)
  return {name: t.detach().to(torch.float32).numpy() for name, t in state.items()}


def read_hf_weights(folder: str) -> Dict[str, np.ndarray]:
  """Returns {parameter name: float32 array} of every tensor in the folder's weight files."""
  kind, files = weight_files(folder)
  reader = _read_safetensors if kind == 'safetensors' else _read_torch_bin
  weights = {}
  for path in files:
    weights.update(reader(path))
  return weights


MODELING_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hf_modeling_bipe.py')


def write_hf_folder(folder: str, hf_config: dict, weights: Dict[str, np.ndarray]) -> None:
  """Writes `config.json`, one `model.safetensors` (tensors made contiguous) and the PyTorch
  modeling file that config.json's `auto_map` names, if it names one, into `folder` (a local
  folder or gs://..., through bipe_jax.storage)."""
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top
  from bipe_jax import storage  # pylint: disable=g-import-not-at-top
  modules = {v.split('.')[0] for v in (hf_config.get('auto_map') or {}).values()}
  for module in modules:
    if module != 'modeling_bipe':
      raise ValueError(f'config.json auto_map names {module}.py; bipe_jax ships modeling_bipe.py')
    with open(MODELING_SOURCE, encoding='utf-8') as f:
      storage.write_text_atomic(os.path.join(folder, module + '.py'), f.read())
  storage.write_text_atomic(os.path.join(folder, CONFIG_NAME),
                               json.dumps(hf_config, indent=2, sort_keys=True))
  tensors = {k: np.ascontiguousarray(v) for k, v in weights.items()}
  storage.write_bytes_atomic(os.path.join(folder, SAFETENSORS_NAME),
                                save(tensors, metadata={'format': 'pt'}))
