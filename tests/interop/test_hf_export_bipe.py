"""A bipe_* run on its own tokenizer goes to a Hugging Face folder and back: its separator ids
and rule travel in config.json, its tokenizer.model in the folder, and the converted workdir
decodes with that tokenizer from any directory (paths in config.json absolute). The exported
bipe_rope and bipe_alibi folders load in transformers (trust_remote_code) as BiPE models whose
logits equal the run's, and refuse to load as plain Llama."""

import json
import os
import shutil
import sys

import jax
import numpy as np
import pytest

from bipe_jax import config as model_config_lib
from bipe_jax import data
from bipe_jax import model as model_lib
from bipe_jax.runs import restore as runs
from bipe_jax.interop import convert
from bipe_jax.state import checkpointing
from bipe_jax.state import mesh as mesh_lib
from bipe_jax.state import optimizer as optimizer_lib
from bipe_jax.runs import run_record
from bipe_jax.state import train_state as train_state_lib
from tests.fixtures import ROOT
from tests import forkserver

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope='module')
def source(trained_rope_run):
  """The session's text run (tests/fixtures.py): its tokenizer and config are the base here."""
  return trained_rope_run


def bipe_run_on_its_own_tokenizer(source_workdir, workdir, encoding='bipe_rope'):
  """A bipe_* workdir (random parameters, checkpoint 1) with the 320-piece tokenizer of the
  text run `source_workdir`, its separators the tokenizer's sentence ids (not Llama's 869/13)."""
  config = runs.read_config(source_workdir)
  os.makedirs(workdir)
  shutil.copyfile(os.path.join(source_workdir, 'tokenizer.model'),
                  os.path.join(workdir, 'tokenizer.model'))
  with config.unlocked():
    config.data.tokenizer_path = os.path.join(workdir, 'tokenizer.model')
    config.model.position_encoding = encoding
    config.model.separators = 'sentence'
    config.model.separator_ids = tuple(
        int(i) for i in data.get_tokenizer(config.data).separator_ids('sentence'))
  run_record.write_config(workdir, config)
  model = model_lib.Transformer(model_config_lib.model_config_from_dict(config.model))
  mesh = mesh_lib.make_mesh(config.mesh, devices=jax.devices()[:1])
  state, _ = train_state_lib.create_train_state(
      model, optimizer_lib.make_optimizer(config.train), mesh, int(config.data.seq_len), seed=3)
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'), every_steps=1, keep=1,
                                    async_save=False)
  ckpt.save(1, state, None, force=True)
  ckpt.close()
  return config, jax.device_get(state.params)


def test_bipe_run_exports_with_its_separators_and_tokenizer_and_comes_back(source, tmp_path):
  workdir, hf, back = (str(tmp_path / n) for n in ('bipe', 'hf', 'back'))
  config, params = bipe_run_on_its_own_tokenizer(source, workdir)
  ids = sorted(config.model.separator_ids)
  assert ids and set(ids) != {869, 13}

  convert.workdir_to_hf(workdir, hf)
  exported = json.load(open(os.path.join(hf, 'config.json'), encoding='utf-8'))
  assert exported['rpe_type'] == 'bipe_rope'
  assert exported['bipe_separator_ids'] == ids and exported['bipe_separator_rule'] == 'sentence'
  with open(os.path.join(hf, 'tokenizer.model'), 'rb') as a, \
       open(os.path.join(workdir, 'tokenizer.model'), 'rb') as b:
    assert a.read() == b.read()

  convert.hf_to_workdir(hf, back, seq_len=int(config.data.seq_len))
  saved = runs.read_config(back)
  assert sorted(saved.model.separator_ids) == ids  # read back, not the official ids
  for path in (saved.data.data_dir, saved.data.tokenizer_path):
    assert os.path.isabs(path), path
  run = runs.load_run(back, attention_impl='dense')
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(run.params), params)
  assert_loads_in_transformers_as_what_it_is(hf, config, run)

  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  proc = forkserver.run(
      [sys.executable, os.path.join(ROOT, 'eval', 'generate.py'), f'--workdir={back}',
       '--prompt=The model', '--max_new_tokens=4', '--temperature=0'],
      cwd=str(elsewhere), capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'text: The model' in proc.stdout, proc.stdout
  assert not os.listdir(elsewhere)  # nothing looked for or built in the current directory


TEXT = ('The river rose in the night!\nBy morning the bridge was gone.\nWho saw it go?\n'
        'Nobody spoke of it again.\nThe children kept asking where the water went. Why?\n')


def assert_loads_in_transformers_as_what_it_is(hf, config, run):
  """trust_remote_code builds the folder's own modeling_bipe.py model, whose logits equal the
  run's on a real text; plain loading refuses instead of building a Llama without BiPE."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  exported = json.load(open(os.path.join(hf, 'config.json'), encoding='utf-8'))
  assert exported['model_type'] == 'bipe_llama'
  assert exported['rpe_type'] == run.model_config.position_encoding
  assert os.path.isfile(os.path.join(hf, exported['auto_map']['AutoModelForCausalLM']
                                     .split('.')[0] + '.py'))
  with pytest.raises(ValueError, match='trust_remote_code=True'):
    transformers.AutoModelForCausalLM.from_pretrained(hf, trust_remote_code=False)
  model = transformers.AutoModelForCausalLM.from_pretrained(hf, trust_remote_code=True).eval()
  assert type(model).__name__ == 'BipeLlamaForCausalLM'

  ids = data.get_tokenizer(config.data).encode_document(TEXT)[None].astype(np.int64)
  separators = np.isin(ids, config.model.separator_ids).sum()
  assert ids.shape[1] > 40 and separators >= 4  # several segments, and sentences of the text
  with run.context():
    ours = np.asarray(jax.jit(run.apply_fn())(run.params, ids.astype(np.int32)))
  with torch.no_grad():
    theirs = model(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


def test_an_exported_bipe_alibi_run_loads_in_transformers_as_what_it_is(source, tmp_path):
  workdir, hf = str(tmp_path / 'run'), str(tmp_path / 'hf')
  config, _ = bipe_run_on_its_own_tokenizer(source, workdir, 'bipe_alibi')
  convert.workdir_to_hf(workdir, hf)
  assert_loads_in_transformers_as_what_it_is(
      hf, config, runs.load_run(workdir, attention_impl='dense'))
