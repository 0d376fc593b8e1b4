"""The README's commands, and those of the docs pages its text moved to (`DOCUMENTED`: training,
evaluation, compile, results), fit together as written, in whatever order the pages have them.

Every `train/main.py` command of their ```bash blocks is resolved as the CLI resolves it
(config file + --config.* overrides through ml_collections, then training/resolve.py), and a
fine-tune (`train.init_from`) is checked against the README command that made its source with
the CLI's own check (`init_from.check_source`: same encoding, same separators rule), without
training anything: each command's workdir gets the config.json the run would record (stand-in
separator ids for the tokenizer's) and an empty checkpoint folder. A recipe that silently
changes the encoding of its source (the YaRN fine-tune of a bipe_alibi run that trained
bipe_rope) fails here. Every flag of every such command is one its script defines.
tests/project/test_readme_recipes.py (slow) then runs every command at a tiny size.
"""

import os
import re
import shlex

import pytest
from absl import flags
from ml_collections import config_flags

from bipe_jax.training import resolve as resolve_lib
from bipe_jax.training import init_from
from bipe_jax.runs import run_record
from tests import fixtures

ROOT = fixtures.ROOT
# The README, then the docs pages that continue its commands (a fine-tune of the README's
# runs/tiny, the HF export, the compile commands, the CHE grid), in the order they are read.
DOCUMENTED = ('README.md', 'docs/training.md', 'docs/evaluation.md', 'docs/compile.md',
              'docs/results.md')


def documented_text() -> str:
  """README.md and the DOCUMENTED docs pages, one after the other."""
  texts = []
  for name in DOCUMENTED:
    with open(os.path.join(ROOT, name), encoding='utf-8') as f:
      texts.append(f.read())
  return '\n'.join(texts)


def readme_command_lines(text: str) -> list:
  """[(argv after `python`, the line's trailing comment or '')] of the `python ...` commands in
  the ```bash blocks, in README order (continuations joined)."""
  commands = []
  for block in re.findall(r'```bash\n(.*?)```', text, re.S):
    for line in block.replace('\\\n', ' ').splitlines():
      argv = shlex.split(line, comments=True)
      if argv and argv[0].endswith('python'):
        commands.append((argv[1:], line.partition(' #')[2].strip()))
  return commands


def readme_commands(text: str) -> list:
  """argv lists of the `python ...` commands in the ```bash blocks (comments dropped)."""
  return [argv for argv, _ in readme_command_lines(text)]


def training_commands(text: str) -> list:
  """{workdir: flags} of the README's train/main.py commands ('...' placeholders left out)."""
  runs = {}
  for argv in readme_commands(text):
    if argv[0] != 'train/main.py' or '...' in argv:
      continue
    args = dict(a[2:].split('=', 1) for a in argv[1:] if a.startswith('--') and '=' in a)
    runs[args['workdir']] = [a for a in argv[1:]]
  return runs


def resolve(argv: list):
  """(config as train/main.py sees it after derivation, the number of CPU devices)."""
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=flag_values, sys_argv=['prog', *argv],
                                  lock_config=True)
  flag_values(['prog', *[a for a in argv if a.startswith('--config')]], known_only=True)
  config = flag_values.config
  devices = next((int(a.split('=')[1]) for a in argv if a.startswith('--cpu_devices=')), 1)
  resolved = resolve_lib.resolve(config, device_count=devices, init_source_seq_len=(
      init_from.source_seq_len(config.train.init_from)))
  return resolved.to_config_dict()


def check_in_order(runs: dict) -> list:
  """Resolves and checks every run once its source (a README workdir) exists; returns the
  workdirs in the order done. Runs from the current directory."""
  done, pending = [], dict(runs)
  while pending:
    ready = [w for w, argv in pending.items()
             if not any(f'init_from={src}' in ' '.join(argv) and src not in done
                        for src in runs if src != w)]
    assert ready, f'README fine-tunes start from runs no README command makes: {list(pending)}'
    for workdir in ready:
      config = resolve(pending.pop(workdir))
      try:
        init_from.check_source(config)
      except init_from.InitFromError as e:
        raise AssertionError(f'README command for --workdir={workdir}: {e}') from None
      if config.model.separators != 'ids':  # what the run's tokenizer would resolve
        with config.unlocked():
          config.model.separator_ids = (3, 4)
      run_record.write_config(workdir, config)
      os.makedirs(os.path.join(workdir, 'checkpoints', '1'), exist_ok=True)
      done.append(workdir)
  return done


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
  os.symlink(os.path.join(ROOT, 'configs'), tmp_path / 'configs')
  monkeypatch.chdir(tmp_path)
  return tmp_path


def test_readme_training_commands_fit_together(in_tmp):
  text = documented_text()
  runs = training_commands(text)
  assert len(runs) >= 3, runs  # the quick start, its fine-tune, the passkey pair at least
  finetunes = [w for w, argv in runs.items() if any('init_from=' in a for a in argv)
               or any('scrolls_finetune.py:' in a for a in argv)]
  assert finetunes, 'the README shows no fine-tune'
  done = check_in_order(runs)
  assert sorted(done) == sorted(runs)


def test_a_recipe_that_changes_its_source_encoding_is_caught(in_tmp):
  text = '''```bash
python train/main.py --config=configs/tiny.py --workdir=runs/a \\
    --config.model.position_encoding=bipe_alibi
```
then
```bash
python train/main.py --config=configs/tiny.py --workdir=runs/b \\
    --config.train.init_from=runs/a --config.model.rope_scaling=yarn
```'''
  runs = training_commands(text)
  assert list(runs) == ['runs/a', 'runs/b']
  with pytest.raises(AssertionError, match="workdir=runs/b: .*'bipe_alibi', this run uses "
                                           "'bipe_rope'"):
    check_in_order(dict(reversed(list(runs.items()))))  # whatever the order


def defined_flags(script: str) -> set:
  """The flag names a CLI script defines (absl DEFINE_* calls; argparse add_argument)."""
  text = open(os.path.join(ROOT, script), encoding='utf-8').read()
  names = set(re.findall(r"DEFINE_\w+\(\s*'(\w+)'", text))
  names |= set(re.findall(r"add_argument\(\s*'--(\w+)'", text))
  # Flags a script takes from a shared library module (`from bipe_jax.x import flags as ...`).
  for package in re.findall(r'from (bipe_jax[\w.]*) import flags as', text):
    names |= defined_flags(os.path.join(*package.split('.'), 'flags.py'))
  return names


def test_readme_command_flags_exist():
  """Every --flag of every README / docs command is one its script defines (or absl's own)."""
  text = documented_text()
  scripts = {'-m': 'bipe_jax/interop/convert.py'}
  checked = 0
  for argv in readme_commands(text):
    script = scripts.get(argv[0], argv[0])
    if not script.endswith('.py') or '...' in argv:
      continue
    names = defined_flags(script) | {'verbosity', 'helpfull'}
    for arg in argv[1:]:
      if arg.startswith('--'):
        name = arg[2:].split('=', 1)[0].split('.', 1)[0]
        assert name in names, f'README: {" ".join(argv)}: {script} has no flag --{name}'
        checked += 1
  assert checked > 20
