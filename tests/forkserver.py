"""Python subprocesses of the suite started by forking a process that has already imported the
project, instead of a fresh interpreter each time.

A `python train/main.py ...` subprocess spends ~3.5 of its ~15 s of CPU importing JAX, Flax,
Orbax and the library before it reads a flag (measured on the 2-core machine: 12.4 s against
15.4-16.6 s of CPU for the suite's 120-step tiny run). The suite starts about a hundred of them.
`run(argv, ...)` behaves like `subprocess.run(argv, capture_output=True, ...)`: a
CompletedProcess with the exit code (minus the signal for a killed one), stdout and stderr,
TimeoutExpired after `timeout` seconds (the child killed). When `argv` is `python SCRIPT ...` or
`python -m MODULE ...` or `python -c CODE ...` it asks this worker's fork server (started on first use, one per pytest
worker, stopped when the worker exits) to fork a child that runs the script as `__main__`
exactly as the interpreter would:

- environment, working directory, sys.argv and sys.path (the script's folder, the working
  directory for -m, '' for -c first, then the request's PYTHONPATH, then the interpreter's own entries) are the
  request's; stdin is /dev/null, stdout and stderr go to files the caller reads;
- at the end it does what interpreter shutdown does: waits for non-daemon threads, runs the
  atexit functions, flushes; an uncaught exception prints its traceback and exits 1;
  SystemExit's code is the exit code.

The server only imports (PRELOAD); it never starts a JAX backend, so each child starts its own
with the request's XLA_FLAGS (the device count, the suite's fast-compile flags), which XLA reads
when the backend starts, not at import. A request whose environment differs from the server's
in a variable read at import or process start (`_STARTUP_PREFIXES`: JAX_*, PYTHON*, LD_*, glibc
malloc, thread-pool sizes) runs as a plain subprocess, as does anything that is not a
Python command. What bipe_jax.storage does with STORAGE_EMULATOR_HOST when imported (point
the other GCS clients at the emulator) the child does again with the request's environment.
Tests that signal, kill or run several processes at once use subprocess.Popen directly. `python -m tests.forkserver` is the server's own entry point.
"""

import atexit
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading

PRELOAD = ('numpy', 'jax', 'flax.linen', 'optax', 'orbax.checkpoint', 'absl.app',
           'ml_collections.config_flags', 'bipe_jax.cli', 'bipe_jax.training.cli',
           'bipe_jax.training.trainer', 'bipe_jax.evaluation.cli', 'bipe_jax.data', 'configs.base')
# Read when the interpreter, its C libraries or the preloaded modules start (JAX's config reads
# JAX_* at import); XLA_FLAGS and libtpu's variables (TPU_*, ALLOW_MULTIPLE_LIBTPU_LOAD, which
# bipe_jax.compile.topologies sets in the process) are read when a backend starts, in the child.
_STARTUP_PREFIXES = ('JAX_', 'PYTHON', 'LD_', 'MALLOC_', 'GLIBC_', 'OMP_', 'OPENBLAS_', 'MKL_',
                     'TF_')
_LAZY = ('PYTHONPATH',)  # applied by the child itself


def _startup_environment(env: dict) -> dict:
  return {k: v for k, v in env.items()
          if k.startswith(_STARTUP_PREFIXES) and k not in _LAZY}


# ----------------------------------------------------------------------------------------------
# The server (python -m tests.forkserver): one request per line on stdin, answers on stdout.

def _child(request: dict, base_path: list) -> int:
  """Runs in the forked child: the request's process state, then its script as __main__."""
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  for fd, path in ((1, request['stdout']), (2, request['stderr'])):
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, fd)
    os.close(out)
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  os.environ.clear()
  os.environ.update(request['env'])
  storage = sys.modules.get('bipe_jax.storage')  # follows STORAGE_EMULATOR_HOST when imported:
  if storage is not None:  # again, as the import would have in the request's environment
    storage.follow_storage_emulator()
  os.chdir(request['cwd'])
  how, argv = request['argv'][1], request['argv'][1:]
  extra = [p for p in request['env'].get('PYTHONPATH', '').split(os.pathsep) if p]
  if how == '-m':
    first, argv = os.getcwd(), argv[1:]
  elif how == '-c':
    first, argv = '', ['-c', *argv[2:]]
  else:
    first = os.path.dirname(os.path.abspath(argv[0]))
  sys.path[:] = [first, *[os.path.abspath(p) for p in extra], *base_path]
  sys.argv = list(argv)
  code = 0
  try:
    if how == '-m':
      runpy.run_module(argv[0], run_name='__main__', alter_sys=True)
    elif how == '-c':
      main = type(sys)('__main__')
      sys.modules['__main__'] = main
      exec(compile(request['argv'][2], '<string>', 'exec'), main.__dict__)  # pylint: disable=exec-used
    else:
      runpy.run_path(os.path.abspath(argv[0]), run_name='__main__')
  except SystemExit as e:
    if e.code is None:
      code = 0
    elif isinstance(e.code, int):
      code = e.code
    else:
      print(e.code, file=sys.stderr)
      code = 1
  except BaseException:  # pylint: disable=broad-except
    import traceback  # pylint: disable=g-import-not-at-top
    traceback.print_exc()
    code = 1
  try:
    threading._shutdown()  # pylint: disable=protected-access
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # pylint: disable=broad-except
        pass
  return code & 0xFF


def serve():
  """The server loop: imports PRELOAD, then forks a child per request line."""
  import importlib  # pylint: disable=g-import-not-at-top
  for name in PRELOAD:
    importlib.import_module(name)
  from bipe_jax.training import event_file  # pylint: disable=g-import-not-at-top
  event_file.import_tensorboardx()  # tensorboardX, without torch
  from tests import gc_settings  # pylint: disable=g-import-not-at-top
  gc_settings.collect_less_often(freeze=True)  # the children inherit both
  # The interpreter's own entries, without this process's first entry and PYTHONPATH.
  own = {os.path.abspath(p) for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p}
  base_path = [p for p in sys.path[1:] if os.path.abspath(p) not in own]
  answers = os.fdopen(os.dup(1), 'w', buffering=1)
  os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing else may write to the answer pipe
  answers.write('ready\n')
  for line in sys.stdin:
    request = json.loads(line)
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      code = 1
      try:
        code = _child(request, base_path)
      finally:
        os._exit(code)  # pylint: disable=protected-access
    answers.write(json.dumps({'pid': pid}) + '\n')
    _, status = os.waitpid(pid, 0)
    answers.write(json.dumps({'returncode': os.waitstatus_to_exitcode(status)}) + '\n')


# ----------------------------------------------------------------------------------------------
# The client, in the pytest worker.

_server = None  # (Popen, startup environment) of this worker's server


def _start_server():
  global _server  # pylint: disable=global-statement
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(p for p in (root, env.get('PYTHONPATH')) if p)
  proc = subprocess.Popen([sys.executable, '-m', 'tests.forkserver'], cwd=root, env=env,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
  if proc.stdout.readline().strip() != 'ready':
    proc.kill()
    raise RuntimeError('tests/forkserver.py: the server did not start')
  atexit.register(_stop_server, proc)
  _server = (proc, _startup_environment(env))
  return _server


def _stop_server(proc):
  """Ends the server's loop and waits for it (so that its CPU time, and its children's, is
  counted in the worker's, as a plain subprocess's would be)."""
  try:
    proc.stdin.close()
    proc.wait(timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    proc.kill()
    proc.wait()


def _forkable(argv, env) -> bool:
  if len(argv) < 2 or argv[0] != sys.executable:
    return False
  if argv[1].startswith('-') and (argv[1] not in ('-m', '-c') or len(argv) < 3):
    return False
  server = _server or _start_server()
  return _startup_environment(env) == server[1] and server[0].poll() is None


def _translate_newlines(text: str) -> str:
  return text.replace('\r\n', '\n').replace('\r', '\n')  # as text=True reads a pipe


def run(argv, *, capture_output=True, cwd=None, env=None, timeout=None, text=False, check=False):
  """subprocess.run(argv, capture_output=True, cwd=, env=, timeout=, text=, check=), through the
  fork server when `argv` is a Python script or module run (see the module docstring)."""
  if not capture_output:
    raise ValueError('forkserver.run always captures the output')
  argv = [str(a) for a in argv]
  env = dict(os.environ if env is None else env)
  if not _forkable(argv, env):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=text,
                          timeout=timeout, check=check)
  proc = _server[0]
  with tempfile.TemporaryDirectory(prefix='forkserver_') as tmp:
    paths = {name: os.path.join(tmp, name) for name in ('stdout', 'stderr')}
    proc.stdin.write(json.dumps({'argv': argv, 'env': env, 'cwd': os.path.abspath(cwd or '.'),
                                 **paths}) + '\n')
    proc.stdin.flush()
    pid = json.loads(proc.stdout.readline())['pid']
    fired = []
    def kill():
      fired.append(True)
      os.kill(pid, signal.SIGKILL)
    timer = threading.Timer(timeout, kill) if timeout else None
    if timer:
      timer.start()
    try:
      returncode = json.loads(proc.stdout.readline())['returncode']
    finally:
      if timer:
        timer.cancel()
    outputs = []
    for name in ('stdout', 'stderr'):
      with open(paths[name], 'rb') as f:
        data = f.read()
      outputs.append(_translate_newlines(data.decode(errors='replace')) if text else data)
  if fired:
    raise subprocess.TimeoutExpired(argv, timeout, output=outputs[0], stderr=outputs[1])
  result = subprocess.CompletedProcess(argv, returncode, *outputs)
  if check:
    result.check_returncode()
  return result


if __name__ == '__main__':
  serve()
