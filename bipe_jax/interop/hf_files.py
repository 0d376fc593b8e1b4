"""Reading and writing Hugging Face model folders: `config.json` plus weight files.

Weights are read tensor by tensor into float32 NumPy arrays:
- `model.safetensors`, or shards listed in `model.safetensors.index.json` (no PyTorch needed);
- `pytorch_model.bin`, or shards listed in `pytorch_model.bin.index.json` (needs PyTorch; a clear
  error says so when it is missing).
Writing always produces one `model.safetensors` (no PyTorch needed).
"""

from __future__ import annotations

import io
import json
import os
from typing import Dict

import numpy as np

from bipe_jax import storage

CONFIG_NAME = 'config.json'
SAFETENSORS_NAME = 'model.safetensors'
SAFETENSORS_INDEX = 'model.safetensors.index.json'
TORCH_NAME = 'pytorch_model.bin'
TORCH_INDEX = 'pytorch_model.bin.index.json'


def read_hf_config(folder: str) -> dict:
  """Returns the parsed `config.json` of a Hugging Face model folder."""
  path = storage.join(folder, CONFIG_NAME)
  config = storage.read_json(path)
  if config is None:
    raise ValueError(f'not a Hugging Face model folder: {folder!r} has no {CONFIG_NAME}')
  return config


def _shard_files(folder: str, index_name: str) -> list:
  weight_map = json.loads(storage.read_bytes(storage.join(folder, index_name)))['weight_map']
  return sorted(set(weight_map.values()))


def weight_files(folder: str) -> tuple:
  """Returns ('safetensors' | 'torch', [file paths]) for the weights in `folder`.

  safetensors is preferred when both formats are present (it needs no PyTorch).
  """
  def exists(name):
    return storage.isfile(storage.join(folder, name))
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
  if not storage.is_local(path):  # safetensors maps local files only: read the object whole
    from safetensors.numpy import load  # pylint: disable=g-import-not-at-top
    return {name: np.asarray(t, dtype=np.float32)
            for name, t in load(storage.read_bytes(path)).items()}
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
  source = path if storage.is_local(path) else io.BytesIO(storage.read_bytes(path))
  state = torch.load(source, map_location='cpu', weights_only=True)
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
  modules = {v.split('.')[0] for v in (hf_config.get('auto_map') or {}).values()}
  for module in modules:
    if module != 'modeling_bipe':
      raise ValueError(f'config.json auto_map names {module}.py; bipe_jax ships modeling_bipe.py')
    storage.write_bytes_atomic(storage.join(folder, module + '.py'),
                               storage.read_bytes(MODELING_SOURCE))
  storage.write_json(storage.join(folder, CONFIG_NAME), hf_config, sort_keys=True)
  tensors = {k: np.ascontiguousarray(v) for k, v in weights.items()}
  storage.write_bytes_atomic(storage.join(folder, SAFETENSORS_NAME),
                                save(tensors, metadata={'format': 'pt'}))
