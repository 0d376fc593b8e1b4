"""docs/tpu.md's commands as written: every `python` command's script exists and defines each of
its flags, and each --config names a preset that builds (the TPU preset and its variants)."""

import os

import pytest

from configs import paper_151m
from configs import paper_151m_tpu
from tests.project.test_readme_commands import ROOT, defined_flags, readme_command_lines

GUIDE = os.path.join(ROOT, 'docs', 'tpu.md')


def guide_commands() -> list:
  return [argv for argv, _ in readme_command_lines(open(GUIDE, encoding='utf-8').read())]


def test_guide_commands_use_flags_their_scripts_define():
  commands = guide_commands()
  scripts = {argv[0] for argv in commands}
  assert {'train/build_data.py', 'train/compile.py', 'eval/perplexity.py'} <= scripts, scripts
  for argv in commands:
    assert os.path.isfile(os.path.join(ROOT, argv[0])), argv
    names = defined_flags(argv[0]) | {'verbosity', 'helpfull'}
    for arg in argv[1:]:
      if not arg.startswith('--'):
        continue
      name = arg[2:].split('=', 1)[0].split('.', 1)[0]
      if name not in names and name.startswith('no'):
        name = name[2:]  # absl's --noFLAG of a boolean
      assert name in names, f'docs/tpu.md: {" ".join(argv)}: {argv[0]} has no flag --{name}'
      if arg.split('=', 1)[0] == '--config':  # the preset (not a --config.x.y override)
        path = arg.split('=', 1)[1].partition(':')[0]
        assert os.path.isfile(os.path.join(ROOT, path)), arg


@pytest.mark.parametrize('preset', paper_151m.PRESETS)
def test_the_tpu_preset_is_the_paper_preset_with_tpu_settings(preset):
  paper, tpu = paper_151m.get_config(preset), paper_151m_tpu.get_config(preset)
  assert (tpu.model.dtype, tpu.model.remat) == ('bfloat16', 'save_projections')
  assert (tpu.train.loss_chunk_tokens, tpu.data.num_threads) == (4096, 32)
  changed = {'model.dtype', 'model.remat', 'train.loss_chunk_tokens', 'data.num_threads',
             'data.prefetch', 'model.block_size'}
  assert tpu.model.block_size == 512  # the Pallas kernel's tiles (configs/paper_151m_tpu.py)
  for section in ('model', 'data', 'train', 'checkpoint', 'mesh'):
    for key, value in paper[section].items():
      if f'{section}.{key}' not in changed:
        assert tpu[section][key] == value, (section, key)
