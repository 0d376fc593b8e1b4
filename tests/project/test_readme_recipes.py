"""The README's recipes run as written: every `python ...` command of the ```bash blocks of
README.md and of the docs pages that continue it (test_readme_commands.DOCUMENTED: training,
evaluation, compile, results) runs, in their order, in one temporary directory (the README's relative paths: configs/ linked
there, data_cache/, runs/, results files; scripts by absolute path, nothing written in the
repository), each shrunk to a tiny size only by flags appended to the README's own text
(`SHRINK`: the last value of a flag wins; training runs: 2 steps of batch 2, one layer of width
64, rows mixed in windows of 8, not 4,096, which would all be tokenised before the first step;
the same flags for a run and the runs fine-tuned from it). A README edit that breaks a
recipe (a flag renamed, a fine-tune that no longer fits its source, an output not written)
fails here. About 110 s on the 2-core machine.

What is run: train/build_data.py; the tiny training run and, as its comment says, the same
command again to resume (2 steps, then to step 4); eval/perplexity.py and eval/generate.py on
it; its YaRN fine-tune (train.init_from); the passkey run, its YaRN fine-tune and
eval/passkey.py; the SCROLLS fine-tune and eval/scrolls.py; the HF export
(`bipe_jax.convert --from runs/tiny --to hf_tiny`) and the conversion back; the fine-tune from
a Hugging Face folder; both train/compile.py commands (the 151M and 1B presets' configs,
topologies and --output, compiled for their TPU slices with the model shrunk to one layer of
width 64, vocabulary 512 and 128 tokens, without the cost model's two extra compiles
(`--nopredict`; tests/compile/test_step_cost.py runs them): ~6 s each, where the full-size
compiles take minutes).

Placeholders of the README are the only text replaced (`PLACEHOLDERS`): `HF_LLAMA_DIR` and
`/path/to/hf_folder` become the folder the README's export writes (so those commands wait for
it), `/data/scrolls/qasper` a small generated set in the SCROLLS schema
(tests/data/test_scrolls.py's `write_set`), and `...` ("your other flags") is dropped. A command the
README shows twice (the conversion back) runs once: a second conversion into the same workdir
is refused, as it should be. The compile commands need libtpu (make setup installs it); without
it they are left out, as tests/compile/test_aot_compile.py is. Last, the README's `make demo`:
the Makefile's command for it (`makefile_command('demo')`), shrunk by `DEMO_SHRINK` (2 steps of
batch 2 for rope and bipe_rope, scored at 1x and 2x on 256 tokens: ~25 s on the 2-core machine)
and run on the embedded corpus that train/build_data.py built here. Not run: the other
non-python lines (`make test`, `make setup`, `pip install -r requirements-tpu.txt`;
tests/project/test_readme.py names where the README's run).

Every command must exit 0 without a traceback and write what it names (--workdir of a training
run with its checkpoint, --output, --plot, --to); a resume must resume, a fine-tune must start
from its source's parameters. Subprocesses share the suite's compilation cache (conftest.py).
"""

import importlib.util
import json
import os
import time

import numpy as np
import pytest

from bipe_jax.state import checkpointing
from tests.training.test_cli_errors import run
from tests.project.test_readme_commands import ROOT, documented_text, in_tmp, readme_command_lines  # pylint: disable=unused-import
from tests.data.test_scrolls import write_set

pytestmark = [pytest.mark.slow]

STEPS = 2  # each training run; the resume goes on to 2 * STEPS
SMALL_MODEL = ('--config.model.num_layers=1', '--config.model.hidden_size=64',
               '--config.model.num_heads=4', '--config.model.ffn_size=128')
TRAIN = (f'--config.train.steps={STEPS}', f'--config.checkpoint.every_steps={STEPS}',
         '--config.train.batch_size=2', '--config.train.log_every=1',
         '--config.data.shuffle_window=8', *SMALL_MODEL)
DEMO_SHRINK = ('--steps=2', '--batch_size=2', '--multipliers=1,2', '--max_tokens=256',
               '--cpu_devices=1')
SHRINK = {  # script -> flags appended to the README's command
    'train/build_data.py': (),
    'train/main.py': TRAIN,
    'eval/perplexity.py': ('--lengths=128,256', '--max_tokens=1024'),
    'eval/generate.py': ('--max_new_tokens=8',),
    'eval/passkey.py': ('--lengths=64,128', '--depths=0,1', '--trials=2'),
    'eval/scrolls.py': ('--max_examples=2', '--max_new_tokens=4'),
    '-m': (),  # python -m bipe_jax.convert
    'eval/che_sweep.py': ('--tasks=parity_check', '--encodings=rope', '--seeds=0', '--steps=2',
                          '--batch_size=4', '--eval_lengths=41', '--eval_samples=2'),
    'eval/demo.py': DEMO_SHRINK,
    'train/compile.py': (*SMALL_MODEL, '--config.model.vocab_size=512',
                         '--config.data.seq_len=128', '--config.train.batch_size=16',
                         '--nopredict'),  # the cost model's two compiles: tests/compile/test_step_cost.py
}
RESUME_NOTE = 'run it again to resume'
HF_FOLDER = 'hf_tiny'  # what the README's `convert --from runs/tiny --to hf_tiny` writes
SCROLLS_SET = 'scrolls/qasper'  # generated here (relative to the temporary directory)
PLACEHOLDERS = {'HF_LLAMA_DIR': HF_FOLDER, '/path/to/hf_folder': HF_FOLDER,
                '/data/scrolls/qasper': SCROLLS_SET}


def substitute(argv: list) -> tuple[list, set]:
  """(argv with the README's placeholders replaced and '...' dropped, the paths substituted:
  they must exist before the command runs)."""
  out, needs = [], set()
  for arg in argv:
    if arg == '...':
      continue
    for placeholder, path in PLACEHOLDERS.items():
      if placeholder in arg:
        arg = arg.replace(placeholder, path)
        needs.add(path)
    out.append(arg)
  return out, needs


def flag_values(argv: list, name: str) -> list:
  """Values of --name=V and of `--name V` in argv, in order."""
  values = [a.split('=', 1)[1] for a in argv if a.startswith(f'--{name}=')]
  values += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == f'--{name}']
  return values


def expected_outputs(argv: list) -> list:
  """The files and folders a command names as its outputs."""
  paths = flag_values(argv, 'output') + flag_values(argv, 'plot') + flag_values(argv, 'to')
  if argv[0] == 'train/main.py':
    paths += flag_values(argv, 'workdir')
  return paths


def checkpoint_steps(workdir: str) -> list:
  return sorted(checkpointing.step_dirs(os.path.join(workdir, 'checkpoints')))


def run_one(argv: list, extra=()) -> str:
  """Runs `python argv + SHRINK + extra` in the current directory; its stdout. Asserts exit 0,
  no traceback, and every output it names written."""
  args = [*argv, *SHRINK[argv[0]], *extra]
  start = time.time()
  proc = run(*args, cwd=os.getcwd())
  shown = f'python {" ".join(args)} ({time.time() - start:.1f} s):\n' + proc.stdout[-3000:] \
      + proc.stderr[-3000:]
  print(shown.splitlines()[0])
  assert proc.returncode == 0 and 'Traceback' not in proc.stderr, shown
  missing = [p for p in expected_outputs(args) if not os.path.exists(p)]
  assert not missing, f'{shown}\nnot written: {missing}'
  if argv[0] == 'train/main.py':
    workdir = flag_values(args, 'workdir')[-1]
    assert STEPS in checkpoint_steps(workdir), shown
    if flag_values(args, 'config.train.init_from') or 'scrolls_finetune.py:' in args[1]:
      assert 'parameters from ' in proc.stdout, shown
  return proc.stdout


def makefile_command(target: str) -> list:
  """argv after `python` of the Makefile's one-line recipe for `target` ($(PY) is the python)."""
  with open(os.path.join(ROOT, 'Makefile'), encoding='utf-8') as f:
    lines = f.read().splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(f'{target}:'))
  recipe = [line.strip() for line in lines[start + 1:] if line.startswith('\t')][:1]
  assert recipe and recipe[0].startswith('$(PY) '), f'Makefile target {target}: {recipe}'
  return recipe[0].split()[1:]


def test_readme_recipes_run_as_written(in_tmp):
  text = documented_text()
  write_set(SCROLLS_SET, np.random.default_rng(0), 16)
  with_libtpu = importlib.util.find_spec('libtpu') is not None
  pending, seen, ran = [], [], []
  for argv, note in readme_command_lines(text):
    argv, needs = substitute(argv)
    assert argv[0] in SHRINK, f'README command with no tiny size here: {argv}'
    if argv in seen:  # the same recipe shown twice
      continue
    seen.append(argv)
    if argv[0] == 'train/compile.py' and not with_libtpu:
      continue
    pending.append((argv, needs, note))
  while pending:  # README order, except a command that waits for a placeholder's folder
    ready = next((c for c in pending if all(os.path.exists(p) for p in c[1])), None)
    assert ready, f'no README command makes {[c[1] for c in pending]} for {pending}'
    pending.remove(ready)
    argv, _, note = ready
    run_one(argv)
    if RESUME_NOTE in note:
      workdir = flag_values(argv, 'workdir')[0]
      out = run_one(argv, (f'--config.train.steps={2 * STEPS}',))
      assert f'resumed from checkpoint step {STEPS}' in out
      assert checkpoint_steps(workdir) == [STEPS, 2 * STEPS]
    ran.append(argv[0] if argv[0] != '-m' else argv[1])
  for needed in ('train/build_data.py', 'eval/perplexity.py', 'eval/generate.py',
                 'eval/passkey.py', 'eval/scrolls.py', 'bipe_jax.convert'):
    assert needed in ran, f'the README no longer runs {needed}'
  assert ran.count('train/main.py') >= 5 and ran.count('bipe_jax.convert') == 2, ran
  with open('results.json', encoding='utf-8') as f:
    lengths = [r['length'] for r in json.load(f)['runs'][0]['results']]
  assert lengths == [128, 256]
  # `make demo`, on the corpus train/build_data.py built (the demo's default data_dir).
  demo = makefile_command('demo')
  assert demo == ['eval/demo.py', '--output_dir=demo_out'], demo
  run_one(demo)
  for name in ('DEMO_RESULTS.md', 'ppl.png', 'positions.png'):
    assert os.path.isfile(os.path.join('demo_out', name)), name
  with open('demo_out/results.json', encoding='utf-8') as f:
    runs = json.load(f)['runs']
  assert [r['encoding'] for r in runs] == ['rope', 'bipe_rope']
  assert all([x['length'] for x in r['results']] == [64, 128] for r in runs), runs
