"""Shared helpers for the benchmark scripts: timing, interleaving, medians, RSS, tables.

The machine these run on is shared and noisy, so every comparison in this directory is
made the same way:

  * every candidate is warmed up first (compilation, caches, allocator);
  * candidates are then run *interleaved* (A, B, C, A, B, C, ... with the order rotated
    each round) so that a burst of load from another process hits all of them alike;
  * the statistic reported is the median of the repeats, and ratios are ratios of
    medians measured in the same run.

Timing is only meaningful on a quiet machine: PyTorch and XLA degrade differently under load,
so a ratio taken at load 10 says nothing about load 1. The 1-minute load average is recorded
when this module is imported (the benchmark's start) and when the result is reported; a result
taken above `MAX_LOAD` before the start (or, at the end, above MAX_LOAD + the cores the
benchmark itself keeps busy) is printed marked DISTURBED and not written to `--out`.

Nothing here imports jax or torch at module level, so a subprocess that measures peak
resident memory starts from a clean slate.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Mapping, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LOAD = float(os.environ.get('BENCHMARK_MAX_LOAD', '2.0'))


def load_average() -> float:
  """The 1-minute load average (0 where the platform has none)."""
  try:
    return float(os.getloadavg()[0])
  except (AttributeError, OSError):
    return 0.0


LOAD_AT_START = load_average()


def usable_cores() -> int:
  return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


def disturbance(load_before: float, load_after: float, *, max_load: float = MAX_LOAD,
                own_cores: int | None = None) -> str:
  """'' for a quiet run, else why the timings are not to be trusted.

  Before the start the machine must be below `max_load`; at the end the benchmark's own threads
  (up to `own_cores`, default all usable cores) count in the load, so the bound is
  max_load + own_cores.
  """
  own = usable_cores() if own_cores is None else own_cores
  reasons = []
  if load_before > max_load:
    reasons.append(f'load {load_before:.2f} > {max_load:g} at the start')
  if load_after > max_load + own:
    reasons.append(f'load {load_after:.2f} > {max_load:g} + {own} own cores at the end')
  return '; '.join(reasons)


def block(tree: Any) -> Any:
  """Waits for every array in `tree` (JAX arrays asynchronously dispatch)."""
  if 'jax' in sys.modules:
    import jax  # pylint: disable=g-import-not-at-top
    return jax.block_until_ready(tree)
  return tree


def time_once(fn: Callable[[], Any]) -> float:
  """Seconds for one call of `fn`, waiting for its (JAX) result to be ready."""
  start = time.perf_counter()
  block(fn())
  return time.perf_counter() - start


def time_fn(fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 10) -> list[float]:
  """Runs `fn` `warmup` times untimed, then returns `repeats` timings in seconds."""
  if warmup < 0 or repeats < 1:
    raise ValueError(f'need warmup >= 0 and repeats >= 1, got warmup={warmup}, '
                     f'repeats={repeats}')
  for _ in range(warmup):
    block(fn())
  return [time_once(fn) for _ in range(repeats)]


def cpu_seconds() -> float:
  """User + system CPU time of this process, all threads (load-independent work measure)."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def interleaved(fns: Mapping[str, Callable[[], Any]], *, warmup: int = 3,
                repeats: int = 10, cpu_out: dict | None = None) -> dict[str, list[float]]:
  """Times several candidates round-robin; returns name -> list of seconds.

  Each candidate is warmed up `warmup` times first. Then `repeats` rounds run every
  candidate once, the starting candidate rotating each round so that no candidate is
  always first (or always right after a particular other one).
  `cpu_out`, when given, is filled with name -> list of CPU seconds (user + system, all
  threads) per call: on an oversubscribed machine wall time mostly measures waiting, CPU
  time still measures the work (thread pools that spin while waiting inflate it).
  """
  if not fns:
    raise ValueError('interleaved() needs at least one candidate')
  if warmup < 0 or repeats < 1:
    raise ValueError(f'need warmup >= 0 and repeats >= 1, got warmup={warmup}, '
                     f'repeats={repeats}')
  names = list(fns)
  for name in names:
    for _ in range(warmup):
      block(fns[name]())
  times: dict[str, list[float]] = {name: [] for name in names}
  if cpu_out is not None:
    cpu_out.update({name: [] for name in names})
  for r in range(repeats):
    shift = r % len(names)
    for name in names[shift:] + names[:shift]:
      c0 = cpu_seconds()
      times[name].append(time_once(fns[name]))
      if cpu_out is not None:
        cpu_out[name].append(cpu_seconds() - c0)
  return times


def paired_ratio(times: Mapping[str, Sequence[float]], name: str, base: str) -> float:
  """Median over rounds of times[name][r] / times[base][r] (from `interleaved`).

  Both were measured in the same round, moments apart, so a change of machine load
  between rounds cancels out of each per-round ratio; the median discards the rounds
  where a burst hit only one of the two.
  """
  a, b = times[name], times[base]
  if len(a) != len(b):
    raise ValueError(f'{name} and {base} have different repeat counts ({len(a)}, {len(b)})')
  return median([x / y for x, y in zip(a, b)])


def median(xs: Sequence[float]) -> float:
  return float(statistics.median(xs))


def spread(xs: Sequence[float]) -> float:
  """Relative half inter-quartile range (a robust +- for a median), 0 for < 4 samples."""
  if len(xs) < 4:
    return 0.0
  q = statistics.quantiles(xs, n=4)
  return float((q[2] - q[0]) / 2 / statistics.median(xs))


def peak_rss_bytes() -> int:
  """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
  kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return int(kib) * (1 if sys.platform == 'darwin' else 1024)


def current_rss_bytes() -> int:
  """Current resident set size of this process (from /proc; 0 where unavailable)."""
  try:
    with open('/proc/self/statm') as f:
      pages = int(f.read().split()[1])
    return pages * os.sysconf('SC_PAGE_SIZE')
  except (OSError, ValueError, IndexError):
    return 0


def total_memory_bytes() -> int:
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError):
    return 0


def cpu_model() -> str:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or 'unknown'


def machine_info() -> dict[str, Any]:
  """Date, CPU, usable cores, memory and library versions, for the result header."""
  info = {
      'date': datetime.date.today().isoformat(),
      'cpu': cpu_model(),
      'cores': usable_cores(),
      'memory_gib': round(total_memory_bytes() / 2**30, 1),
      'python': platform.python_version(),
  }
  for mod in ('jax', 'jaxlib', 'flax', 'optax', 'torch', 'transformers'):
    if mod in sys.modules:
      info[mod] = getattr(sys.modules[mod], '__version__', '?')
  return info


def machine_line() -> str:
  i = machine_info()
  libs = ', '.join(f'{k} {i[k]}' for k in ('jax', 'flax', 'torch', 'transformers') if k in i)
  return (f"{i['date']} - {i['cpu']}, {i['cores']} cores, {i['memory_gib']} GiB"
          + (f' - {libs}' if libs else ''))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A GitHub markdown table; floats are printed as given (format them beforehand)."""
  if any(len(r) != len(headers) for r in rows):
    raise ValueError('every row needs one cell per header')
  lines = ['| ' + ' | '.join(str(h) for h in headers) + ' |',
           '|' + '|'.join('---' for _ in headers) + '|']
  lines += ['| ' + ' | '.join(str(c) for c in r) + ' |' for r in rows]
  return '\n'.join(lines)


def report(title: str, table: str, notes: Sequence[str] = (), *,
           out: str | None = None, data: Any = None) -> str:
  """Prints a titled result block (machine line, load, table, notes); optionally saves it.

  `out`: a path prefix; writes `<out>.md` (the block) and, when `data` is given,
  `<out>.json` (the raw numbers) -- unless the run was disturbed (see `disturbance`): then the
  block is printed with a DISTURBED mark and nothing is written.
  """
  load_after = load_average()
  disturbed = disturbance(LOAD_AT_START, load_after)
  load_line = (f'Load average (1 min): {LOAD_AT_START:.2f} at the start, {load_after:.2f} at the '
               f'end, on {usable_cores()} cores.')
  if disturbed:
    title = f'DISTURBED ({disturbed}): {title}'
  text = '\n'.join([f'### {title}', '', f'Measured {machine_line()}.', load_line, '', table, '']
                   + [f'- {n}' for n in notes])
  print(text, flush=True)
  if out and disturbed:
    print(f'not written to {out}.md: the machine was not quiet ({disturbed}); measure again '
          f'at load < {MAX_LOAD:g}', file=sys.stderr, flush=True)
    return text
  if out:
    write_results(out, text, None if data is None else {
        'machine': machine_info(), 'load_average': [LOAD_AT_START, load_after], 'data': data})
  return text


def write_results(out: str, text: str, document: dict | None = None) -> None:
  """`text` into OUT.md and `document` (if any) into OUT.json, a local path or gs://...
  (bipe_jax.storage: atomic, folders created)."""
  from bipe_jax import storage  # pylint: disable=g-import-not-at-top  (after the caller's set-up)
  storage.write_text_atomic(out + '.md', text + '\n')
  if document is not None:
    storage.write_text_atomic(out + '.json', json.dumps(document, indent=1, default=str))


def run_json_subprocess(args: Sequence[str], *, env: Mapping[str, str] | None = None,
                        timeout: float | None = None) -> dict[str, Any]:
  """Runs `python args...` in a fresh interpreter; parses its last stdout line as JSON.

  Used to measure peak RSS of one configuration without the memory of earlier ones.
  Returns {'error': ...} instead of raising when the child fails (e.g. out of memory).
  """
  full_env = dict(os.environ)
  full_env['PYTHONPATH'] = REPO_ROOT + os.pathsep + full_env.get('PYTHONPATH', '')
  if env:
    full_env.update(env)
  try:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    return {'error': f'timeout after {timeout} s'}
  lines = [l for l in proc.stdout.strip().splitlines() if l.startswith('{')]
  if proc.returncode != 0 or not lines:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {'error': f'exit {proc.returncode}: ' + ' / '.join(tail)}
  return json.loads(lines[-1])


def fmt_ms(seconds: float) -> str:
  return f'{seconds * 1e3:.1f}'


def fmt_ratio(x: float) -> str:
  return f'{x:.3f}'
