"""Convert checkpoints between the Hugging Face Llama format and bipe_jax workdirs.

    python -m bipe_jax.convert --from HF_DIR --to WORKDIR        # HF Llama / BiPE -> bipe_jax
    python -m bipe_jax.convert --from WORKDIR --to HF_DIR        # bipe_jax -> HF Llama

The direction is detected from `--from` (a Hugging Face folder has a config.json with
`hidden_size`; a workdir has a config.json with a `model` section and `checkpoints/`).

HF -> bipe_jax writes a workdir like the ones train/main.py writes, so `eval/perplexity.py
--workdir=WORKDIR` and `eval/generate.py --workdir=WORKDIR` accept it:
  WORKDIR/config.json          the full config (configs/base.py sections, model fields mapped)
  WORKDIR/config.py            `get_config()` returning config.json (for train/main.py --config)
  WORKDIR/checkpoints/0/       Orbax checkpoint of the converted parameters only (no optimizer
                               state: converting a 1.6B model needs its parameters' memory, not
                               a train state's); fine-tune from it in a new workdir with
                               --config.train.init_from=WORKDIR
  WORKDIR/tokenizer.model      copied when the folder has one (data.tokenizer_path points to it)
The parameters are float32 (the released checkpoints are float16; conversion is exact).

bipe_jax -> HF writes config.json + model.safetensors (+ the run's tokenizer.model): a standard
`LlamaForCausalLM` for `rope` models; bipe_rope / alibi / bipe_alibi in the official BiPE format
(rpe_type, train_scale, model.embeds.0.weight) with the run's separator ids and rule
(`bipe_separator_ids`, `bipe_separator_rule`, which the way back reads) and the folder's own
PyTorch model, modeling_bipe.py (hf_modeling_bipe.py): `transformers.AutoModelForCausalLM.
from_pretrained(HF_DIR, trust_remote_code=True)` loads it with bipe_jax's logits; without
trust_remote_code transformers refuses it (model_type 'bipe_llama').
The destination must be new or empty (`--overwrite` replaces its contents); it is checked before
anything is read or written (bipe_jax.interop.destination).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Optional, Sequence

import jax
import ml_collections
import numpy as np

from bipe_jax import config as model_config_lib
from bipe_jax import defaults
from bipe_jax import schemes
from bipe_jax.interop import destination
from bipe_jax import storage
from bipe_jax.interop import hf_files
from bipe_jax.interop import hf_llama

CONFIG_PY = '''"""Config of a checkpoint converted by bipe_jax.convert: returns config.json beside this file.

  python train/main.py --config={path} --workdir=NEW_WORKDIR --config.train.init_from={workdir}
"""

import json
import os

import ml_collections


def get_config():
  with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'config.json')) as f:
    return ml_collections.ConfigDict(json.load(f))
'''


def _model_fields(hf: dict, separator_ids) -> dict:
  """Mapped fields plus the ModelConfig-only options the official models need."""
  fields = hf_llama.model_fields_from_hf_config(hf, separator_ids=separator_ids)
  known = {f.name for f in dataclasses.fields(model_config_lib.ModelConfig)}
  extra = {
      # The official intra table's last row is a zero padding row (padding_idx=-1).
      'intra_zero_last_row': schemes.get_scheme(fields['position_encoding']).bilevel,
      'train_length': int(hf.get('train_scale', fields['max_position'])),
      'rope_log_scale': bool(hf.get('log_scale', False)),
  }
  fields.update({k: v for k, v in extra.items() if k in known})
  return fields


def load_hf(hf_dir: str, *, separator_ids: Optional[Sequence[int]] = None):
  """(ModelConfig, params) of a Hugging Face Llama-format folder, in memory (float32 NumPy).

  The model is `bipe_jax.model.Transformer(model_config)`; apply it with {'params': params}.
  """
  hf = hf_files.read_hf_config(hf_dir)
  fields = _model_fields(hf, separator_ids)
  weights = hf_files.read_hf_weights(hf_dir)
  intra = weights.get(hf_llama.INTRA_WEIGHT)
  if fields.get('intra_zero_last_row') and intra is not None and np.any(intra[-1]):
    # A PyTorch model reads the stored row (padding_idx only keeps it at zero in training):
    # a folder whose last row is not zero (a bipe_jax export) is run with that row.
    fields['intra_zero_last_row'] = False
  model_config = model_config_lib.model_config_from_dict(fields)
  params = hf_llama.params_from_hf_weights(
      weights, fields, tie_word_embeddings=bool(hf.get('tie_word_embeddings', False)))
  return model_config, params


def _check_params(params, abstract_params):
  """Same tree and shapes as the model's own init (a clear error instead of a late crash)."""
  ours = jax.tree.structure(params)
  theirs = jax.tree.structure(abstract_params)
  if ours != theirs:
    raise ValueError(f'converted parameter tree does not match the model: {ours} vs {theirs}')
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(params),
                          jax.tree.leaves(abstract_params)):
    if tuple(a.shape) != tuple(b.shape):
      raise ValueError(f'converted parameter {jax.tree_util.keystr(path)} has shape {a.shape}; '
                       f'the model expects {b.shape}')


def write_workdir(workdir: str, config: ml_collections.ConfigDict, params, *,
                  step: int = 0) -> str:
  """Writes config.json, config.py and an Orbax checkpoint of `params` (parameters only: no
  optimizer state, so converting needs the memory of the parameters alone) at `step`.

  Evaluation and generation read it like a training run (bipe_jax.runs.restore.load_run);
  to train from it, start a new run with `--config.train.init_from=WORKDIR`. Returns the
  checkpoint directory.
  """
  # Imported here: the training stack is only needed to write workdirs.
  from bipe_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import checkpointing  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bipe_jax.state import train_state as train_state_lib  # pylint: disable=g-import-not-at-top

  model = model_lib.Transformer(model_config_lib.model_config_from_dict(config.model))
  mesh = mesh_lib.make_mesh(config.mesh)
  abstract, shardings = train_state_lib.param_shardings(model, mesh, int(config.data.seq_len))
  params = model_lib.match_layer_layout(params, abstract)  # config.model.scan_layers
  _check_params(params, abstract)
  params = jax.device_put(jax.tree.map(np.asarray, params), shardings)

  from bipe_jax.runs import run_record  # pylint: disable=g-import-not-at-top
  run_record.write_config(workdir, config)  # paths absolute
  config_py = storage.join(workdir, 'config.py')
  storage.write_text_atomic(config_py, CONFIG_PY.replace('{path}', config_py)
                            .replace('{workdir}', workdir))
  ckpt_dir = config.checkpoint.get('dir', '') or storage.join(workdir, 'checkpoints')
  if storage.isdir(ckpt_dir) and storage.listdir(ckpt_dir):
    raise ValueError(f'{ckpt_dir} already holds checkpoints: convert into a new workdir')
  checkpointer = checkpointing.Checkpointer(ckpt_dir, every_steps=1, keep=1, async_save=False)
  try:
    checkpointer.save_params(step, params)
  finally:
    checkpointer.close()
  return ckpt_dir


def hf_to_workdir(hf_dir: str, workdir: str, *,
                  separator_ids: Optional[Sequence[int]] = None,
                  seq_len: Optional[int] = None,
                  base_config: Optional[ml_collections.ConfigDict] = None,
                  overwrite: bool = False) -> str:
  """Converts a Hugging Face Llama / official BiPE folder into a bipe_jax workdir.

  Args:
    hf_dir: folder with config.json and model.safetensors / pytorch_model.bin (or shards).
    workdir: output directory: new or empty (checked before anything is read or written).
    separator_ids: separators instead of the official {869, 13} (non-Llama tokenizers).
    seq_len: data.seq_len of the written config (default: train_scale, else
      max_position_embeddings).
    base_config: the config to start from (default configs/base.py); its model section is
      replaced by the mapped fields.
    overwrite: accept a non-empty `workdir`; its contents are removed once the folder has been
      read and mapped.

  Returns:
    The workdir.
  """
  destination.check_destination(workdir, hf_dir, overwrite=overwrite)
  hf = hf_files.read_hf_config(hf_dir)
  model_config, params = load_hf(hf_dir, separator_ids=separator_ids)
  destination.clear_destination(workdir)
  config = (base_config or defaults.get_base_config()).copy_and_resolve_references()
  with config.unlocked():
    for key, value in dataclasses.asdict(model_config).items():
      config.model[key] = value
    config.model.separators = 'ids'
    config.data.seq_len = int(seq_len or hf.get('train_scale') or model_config.max_position)
    config.data.tokenizer_vocab_size = model_config.vocab_size
    tokenizer = storage.join(hf_dir, 'tokenizer.model')
    if storage.isfile(tokenizer):
      storage.copy_file(tokenizer, storage.join(workdir, 'tokenizer.model'))
      config.data.tokenizer_path = storage.absolute(storage.join(workdir, 'tokenizer.model'))
  write_workdir(workdir, config, params)
  return workdir


def workdir_to_hf(workdir: str, hf_dir: str, *, step: Optional[int] = None,
                  overwrite: bool = False) -> str:
  """Exports a bipe_jax workdir's latest (or `step`) checkpoint to a Hugging Face folder.

  `hf_dir` must be new or empty (checked first) unless `overwrite`: then its contents are
  removed once the run has been read and mapped.
  """
  destination.check_destination(hf_dir, workdir, overwrite=overwrite)
  from bipe_jax.runs import restore as runs  # pylint: disable=g-import-not-at-top
  run = runs.load_run(workdir, step=step, attention_impl='dense')
  fields = dataclasses.asdict(run.model_config)
  from bipe_jax.data import preparation  # pylint: disable=g-import-not-at-top
  fields['separators'] = preparation.separator_rule(run.config.model, run.config.data)
  hf = hf_llama.hf_config_from_model_fields(fields)
  params = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), run.params)
  destination.clear_destination(hf_dir)
  hf_files.write_hf_folder(hf_dir, hf, hf_llama.hf_weights_from_params(params, fields))
  tokenizer = run.config.data.get('tokenizer_path', '')  # the run's own copy (load_run)
  if tokenizer and storage.isfile(tokenizer):
    storage.copy_file(tokenizer, os.path.join(hf_dir, 'tokenizer.model'))
  return hf_dir


def detect_direction(src: str) -> str:
  """'hf_to_bipe' or 'bipe_to_hf' from what `src` holds; ValueError if neither."""
  path = os.path.join(src, 'config.json')
  config = storage.read_json(path)  # a local folder or gs://...
  if config is None:
    raise ValueError(f'--from {src!r} has no config.json: give a Hugging Face model folder or a '
                     'bipe_jax workdir')
  if 'model' in config and isinstance(config['model'], dict):
    return 'bipe_to_hf'
  if 'hidden_size' in config:
    return 'hf_to_bipe'
  raise ValueError(f'{path} is neither a Hugging Face config (hidden_size) nor a bipe_jax '
                   'workdir config (a model section)')


def _parse_ids(text: str):
  if not text:
    return None
  try:
    return tuple(int(x) for x in text.split(','))
  except ValueError:
    raise argparse.ArgumentTypeError(
        f'--separator_ids must be comma-separated integers, got {text!r}') from None


class _OneLineParser(argparse.ArgumentParser):
  """argparse whose usage errors are one `error: ...` line (exit 2), like the absl CLIs'."""

  def error(self, message):
    print(f'error: {message} (python -m bipe_jax.convert --help)', file=sys.stderr)
    raise SystemExit(2)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = _OneLineParser(
      prog='python -m bipe_jax.convert',
      description='Convert between Hugging Face Llama-format folders (incl. the released BiPE '
                  'checkpoints) and bipe_jax workdirs; the direction is detected from --from.')
  parser.add_argument('--from', dest='src', required=True,
                      help='a Hugging Face folder or a bipe_jax workdir')
  parser.add_argument('--to', dest='dst', required=True, help='output directory')
  parser.add_argument('--separator_ids', type=_parse_ids, default=None,
                      help='HF->bipe: comma-separated separator ids (default: official 869,13)')
  parser.add_argument('--seq_len', type=int, default=0,
                      help='HF->bipe: data.seq_len of the written config (default train_scale)')
  parser.add_argument('--step', type=int, default=None,
                      help='bipe->HF: checkpoint step to export (default: the latest)')
  parser.add_argument('--overwrite', action='store_true',
                      help='replace the contents of a non-empty --to directory (default: --to '
                           'must be new or empty, so no run or model folder is modified)')
  args = parser.parse_args(argv)
  try:
    if storage.isfile(args.dst):
      raise ValueError(f'--to {args.dst!r} is a file, not a directory')
    destination.check_destination(args.dst, args.src, overwrite=args.overwrite)
    direction = detect_direction(args.src)
    if direction == 'hf_to_bipe':
      hf_to_workdir(args.src, args.dst, separator_ids=args.separator_ids,
                    seq_len=args.seq_len or None, overwrite=args.overwrite)
      print(f'converted Hugging Face folder {args.src} -> bipe_jax workdir {args.dst}\n'
            f'  evaluate: python eval/perplexity.py --workdir={args.dst} --lengths=...\n'
            f'  generate: python eval/generate.py --workdir={args.dst} --prompt_ids=1,2,3')
    else:
      workdir_to_hf(args.src, args.dst, step=args.step, overwrite=args.overwrite)
      print(f'exported bipe_jax workdir {args.src} -> Hugging Face folder {args.dst}')
  except (ValueError, ImportError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0
