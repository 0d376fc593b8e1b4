"""What every absl command line of the project runs instead of `absl.app.run(main)`.

    if __name__ == '__main__':
      cli.run(main)

A user's mistake becomes ONE line on stderr (`error: ...`) and exit status 2, never a
traceback:
- an unknown flag or config field (`--config.train.step=5` -> "did you mean train.steps"),
  a value of the wrong type, a stray positional argument;
- a config file that does not load (`--config=configs/tinyy.py` -> the config files there, the
  closest first), or whose `get_config(param)` refuses its parameter;
- a directory flag (--workdir, --output_dir, --root, --data_dir, --text_dir) naming a file;
- Ctrl-C before the program installed its own handler: `interrupted`, exit 130;
- a bucket that does not answer (bipe_jax.storage_faults): one line naming it and the endpoint,
  exit EXIT_STORAGE (74); a path that cannot be used (no such bucket, a folder that takes no
  write, an output given on the command line that cannot be written: checked before any
  work): one line, exit 2.
`--help` (and absl's --helpfull, --helpshort) prints the usage and exits 0 (absl exits 1).
A CPU-only host runs on JAX's CPU platform without probing for a TPU (bipe_jax.platforms).
Library INFO logs (absl, Orbax, TFDS) stay off the terminal unless --verbosity is given (the
training CLI then sends them to its run's library.log, bipe_jax.runs.run_logging). Errors that are
not the user's (bugs) keep their traceback.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from typing import Callable, NoReturn, Sequence

DIRECTORY_FLAGS = ('workdir', 'output_dir', 'root', 'data_dir', 'text_dir')
# Outputs given on the command line are checked writable before any work (a probe file, an
# object on a bucket, written and deleted: bipe_jax.storage_faults), not after it
OUTPUT_DIR_FLAGS = ('output_dir',)
OUTPUT_FILE_FLAGS = ('output', 'plot', 'position_plot')
HELP_FLAGS = ('help', 'helpfull', 'helpshort', 'helpxml', '?')  # absl's; they exit 0 here
# Exit codes of every command (docs/tpu.md's relaunch loop reads them):
EXIT_OK = 0  # done (a training run: at train.steps, or its data ended)
EXIT_USER_ERROR = 2  # a bad flag, config or path: fix the command (one line says what)
EXIT_STORAGE = 74  # sysexits' EX_IOERR: the storage failed or did not answer (one line naming
# the bucket and the endpoint); a training run kept its last good checkpoint: run the same
# command again once the storage is back (bipe_jax.storage_faults)
EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL: training stopped by SIGTERM (a preemption notice,
# a scheduler) with a checkpoint saved: run the same command again to resume
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


def one_line(text: str) -> str:
  return ' '.join(str(text).split())


def fail(message: str, code: int = EXIT_USER_ERROR) -> NoReturn:
  """Prints `error: message` (one line) on stderr and exits with `code`."""
  print(f'error: {one_line(message)}', file=sys.stderr, flush=True)
  raise SystemExit(code)


def _config_flag_names(flag_values) -> list:
  from ml_collections.config_flags import config_flags  # pylint: disable=g-import-not-at-top
  return [name for name in flag_values
          if config_flags.is_config_flag(flag_values[name])]


def _overrides(argv: Sequence[str], name: str) -> list:
  """[(dotted field path, the argument)] of the `--name.path[=value]` arguments."""
  found = []
  for arg in argv:
    match = re.match(rf'^--?(?:no)?{re.escape(name)}\.([^=]+)', arg)
    if match:
      found.append((match.group(1), arg))
  return found


def unknown_field_message(error: BaseException, argv: Sequence[str], names: Sequence[str]):
  """One line for ml_collections' unknown-field error, or None when `error` is not one.

  ml_collections raises AttributeError / KeyError("'step'\\nDid you mean \"steps\" ...") while
  parsing `--config.train.step=5`; the line names the whole field and its likely spelling."""
  text = str(error.args[0]) if error.args else ''
  match = re.match(r"""^["']*'?([^'"\n]+)'?["']*""", text.replace("\\'", "'"))
  if not match:
    return None
  key = match.group(1).strip("'\"")
  suggestion = re.search(r'Did you mean "([^"]+)"', text)
  for name in names:
    for path, arg in _overrides(argv, name):
      parts = path.split('.')
      if key in parts:
        i = parts.index(key)
        field = '.'.join(parts[:i + 1])
        line = f'{arg}: the config has no field {field}'
        if suggestion:
          line += f'; did you mean --{name}.{".".join(parts[:i] + [suggestion.group(1)])}?'
        return line
  return None


def _config_file_message(name: str, argv: Sequence[str], error: BaseException) -> str:
  """One line for a config flag whose file did not load."""
  specs = [a.split('=', 1)[1] for a in argv if re.match(rf'^--?{re.escape(name)}=', a)]
  spec = specs[-1] if specs else ''  # absl keeps the last value given
  path = spec.split(':', 1)[0]
  if path and not os.path.isfile(path):
    folder = os.path.dirname(path) or '.'
    line = f'--{name}={spec}: no such config file'
    if os.path.isdir(folder):
      files = sorted(f for f in os.listdir(folder) if f.endswith('.py') and f != '__init__.py')
      close = difflib.get_close_matches(os.path.basename(path), files, n=1)
      if close:
        line += f'; did you mean {os.path.join(os.path.dirname(path), close[0])}?'
      elif files:
        line += f' (config files in {folder}: {", ".join(files)})'
    return line
  lines = [l for l in str(error).splitlines() if l.strip()]
  return f'--{name}={spec}: {lines[-1].strip() if lines else type(error).__name__}'


def _without_traceback(text: str) -> str:
  """absl's message for a config file whose get_config raised holds the whole traceback: keep
  the flag and the exception's own message (its last line)."""
  if 'Traceback (most recent call last)' not in text:
    return text
  last = [line for line in text.splitlines() if line.strip()][-1].strip()
  last = re.sub(r'^[\w.]*(Error|Exception): ', '', last)
  flag = re.match(r'flag (--\S+): ', text)
  return f'{flag.group(1)}: {last}' if flag else last


def parse_flags(argv: Sequence[str], flag_values=None) -> list:
  """absl's flag parsing with every user error turned into one line (the `flags_parser` of
  absl.app.run); `flag_values` default absl's global FLAGS."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flag_values = flags.FLAGS if flag_values is None else flag_values
  names = _config_flag_names(flag_values)
  try:
    rest = flag_values(argv)
  except SystemExit as e:  # absl's --help / --helpfull print the usage, then exit 1
    if e.code == 1 and any(a.lstrip('-').split('=')[0] in HELP_FLAGS for a in argv[1:]):
      raise SystemExit(0) from None
    raise
  except flags.Error as e:
    fail(_without_traceback(str(e)))
  except (AttributeError, KeyError) as e:
    line = unknown_field_message(e, argv, names)
    if line is None:
      raise
    fail(line)
  for name in names:  # ml_collections defers a config file's load error to its first use
    if flag_values[name].present:
      try:
        flag_values[name].value.get('model')
      except (OSError, ValueError, TypeError) as e:
        fail(_config_file_message(name, argv, e))
  for name in DIRECTORY_FLAGS:
    if name in flag_values and flag_values[name].value:
      value = flag_values[name].value
      for path in value if isinstance(value, list) else [value]:
        if os.path.exists(path) and not os.path.isdir(path):
          fail(f'--{name}={path} is a file, not a directory')
  if len(rest) > 1:
    fail(f'unexpected arguments {rest[1:]} (flags are written --name=value)')
  _check_outputs(flag_values)
  return rest


def _check_outputs(flag_values) -> None:
  """Each output folder or file given on the command line takes a write (one line, exit 2;
  a bucket that does not answer: exit EXIT_STORAGE)."""
  given = [(name, flag_values[name].value) for name in OUTPUT_DIR_FLAGS + OUTPUT_FILE_FLAGS
           if name in flag_values and flag_values[name].present
           and isinstance(flag_values[name].value, str) and flag_values[name].value]
  if not given:
    return
  from bipe_jax import storage_faults  # pylint: disable=g-import-not-at-top
  for name, path in given:
    check = (storage_faults.check_writable if name in OUTPUT_DIR_FLAGS
             else storage_faults.check_output_file)
    try:
      check(path)
    except storage_faults.UnusablePathError as e:
      fail(f'--{name}: {e}')
    except storage_faults.StorageUnreachableError as e:
      fail(f'--{name}: {e}', EXIT_STORAGE)


def quiet_library_logs() -> None:
  """Unless --verbosity was given, absl/Orbax/TFDS INFO lines (and TFDS's warning for every
  BuilderConfig made at run time, run_logging.QUIET_WARNINGS) stay off the terminal."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  from bipe_jax.runs import run_logging  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS['verbosity'].present:
    absl_logging.set_verbosity(absl_logging.WARNING)
    run_logging.filter_known_noise()


def dump_stacks_on_sigusr1() -> None:
  """`kill -USR1 PID` prints every thread's Python stack to stderr and the run goes on: what a
  run that seems stuck is waiting on (docs/training.md, "A run that seems stuck")."""
  import faulthandler  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  stream = sys.__stderr__  # the process's own stderr (sys.stderr may be a capture without a fd)
  if not hasattr(signal, 'SIGUSR1') or stream is None:
    return
  try:
    faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True, chain=False)
  except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation: no file descriptor
    pass


def run(main: Callable[[list], int | None]) -> None:
  """absl.app.run(main) with one-line user errors, quiet library logs and a one-line Ctrl-C;
  SIGUSR1 prints every thread's stack (`dump_stacks_on_sigusr1`).

  On a host without a TPU or GPU it first makes JAX use its CPU platform (unless JAX_PLATFORMS
  is set): with libtpu installed JAX would otherwise probe for a TPU and print its errors.
  """
  from absl import app  # pylint: disable=g-import-not-at-top
  from bipe_jax import platforms  # pylint: disable=g-import-not-at-top
  platforms.use_cpu_without_accelerator()
  dump_stacks_on_sigusr1()

  def guarded(argv):
    from bipe_jax import storage_faults  # pylint: disable=g-import-not-at-top
    quiet_library_logs()
    try:
      return main(argv)
    except KeyboardInterrupt:
      fail('interrupted', EXIT_INTERRUPTED)
    except storage_faults.StorageUnreachableError as e:
      fail(str(e), EXIT_STORAGE)
    except storage_faults.UnusablePathError as e:
      fail(str(e), EXIT_USER_ERROR)

  app.run(guarded, flags_parser=parse_flags)
