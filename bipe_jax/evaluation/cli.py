"""The bodies of the evaluation command lines (eval/perplexity.py, eval/arithmetic.py).

Each returns a process exit code: 0 on success, 2 with one `error: ...` line on stderr for a
bad argument or an unusable workdir (missing, empty, no config, no checkpoint).
"""

from __future__ import annotations

import os
import sys
import time

from bipe_jax import storage
from bipe_jax import storage_faults
from bipe_jax.evaluation import dataset_fit
from bipe_jax.evaluation import perplexity as ppl
from bipe_jax.runs import restore as runs_lib
from bipe_jax.evaluation import sweep


def _error(message: str) -> int:
  print(f'error: {message}', file=sys.stderr, flush=True)
  return 2


def check_outputs(*paths) -> None:
  """Each output file given (not '') can be written, checked before any work: an unwritable
  path is one UnusablePathError line (a ValueError), not results lost after the evaluation."""
  for path in paths:
    storage_faults.check_output_file(path)


def _tqdm_factory(label: str):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  bars = {}

  def factory(length: int, num_blocks: int):
    bar = tqdm(total=num_blocks, desc=f'{label} L={length}', unit='block', file=sys.stderr,
               leave=False, dynamic_ncols=True)
    bars[length] = bar

    def progress(done: int):
      bar.update(done - bar.n)
      if done >= num_blocks:
        bar.close()

    return progress

  return factory


def check_data_flags(run_data, dataset: str = '', pile_subset: str = '',
                     pile_dir: str = '') -> None:
  """Raises ValueError (one line, naming the flag) for --dataset / --pile_subset / --pile_dir
  that cannot score a run whose data config is `run_data`: checked before any checkpoint is
  read. A Pile evaluation needs the Pile's folder: the run's data.pile_dir or --pile_dir."""
  effective = dataset or run_data.dataset
  if pile_subset:
    if effective != 'pile':
      raise ValueError(f'--pile_subset={pile_subset} needs data.dataset=pile (this run: '
                       f'{effective!r}; add --dataset=pile)')
    from bipe_jax.data import pile  # pylint: disable=g-import-not-at-top
    try:
      pile.parse_subsets(pile_subset)
    except ValueError as e:
      raise ValueError(str(e).replace(f'data.pile_subsets={pile_subset!r}',
                                      f'--pile_subset={pile_subset}')) from None
  if pile_dir and effective != 'pile':
    raise ValueError(f'--pile_dir={pile_dir} needs data.dataset=pile (this run: {effective!r}; '
                     'add --dataset=pile)')
  if effective == 'pile' and not (pile_dir or run_data.get('pile_dir', '')):
    raise ValueError("--dataset=pile: this run has no data.pile_dir; give --pile_dir=FOLDER (a "
                     "folder of the Pile's .jsonl / .jsonl.zst files, local or gs://)")


def data_config_for(run: runs_lib.Run, dataset: str = '', data_dir: str = '',
                    pile_subset: str = '', pile_dir: str = ''):
  """The run's data config with optional dataset / data_dir / pile_dir overrides (unlocked
  copy).

  The tokenizer stays the run's own (load_run set data.tokenizer_path to it): another dataset
  is tokenised with the tokenizer the model was trained with, never with its own.
  `pile_subset` (dataset='pile'): score the validation split of that subset alone (pg19, arxiv,
  github or a meta.pile_set_name; built by train/build_data.py, docs/tpu.md). `pile_dir`: the
  Pile's folder (data.pile_dir; needed by --dataset=pile on a run trained on something else).
  """
  from bipe_jax.data import generated  # pylint: disable=g-import-not-at-top
  from bipe_jax.data import preparation  # pylint: disable=g-import-not-at-top
  check_data_flags(run.config.data, dataset, pile_subset, pile_dir)
  data_config = run.config.data.copy_and_resolve_references()
  with data_config.unlocked():
    if not data_config.tokenizer_path and generated.lookup(data_config.dataset) is None:
      data_config.tokenizer_path = preparation.tokenizer_path(run.config.data)
    if dataset:
      data_config.dataset = dataset
    if data_dir:
      data_config.data_dir = data_dir
    if pile_dir:
      data_config.pile_dir = pile_dir
    if pile_subset:
      from bipe_jax.data import pile  # pylint: disable=g-import-not-at-top
      data_config.pile_subsets = ','.join(pile.parse_subsets(pile_subset))
      data_config.pile_splits = 'validation'
  return data_config


AUTO_OUTPUT = 'auto'


def resolve_output(output: str, workdirs, name: str) -> str:
  """The results file of an evaluation: `output` as given, '' for none, or for 'auto' (the
  CLIs' default) `name` inside the (first) evaluated workdir, never the current directory."""
  if output != AUTO_OUTPUT:
    return output
  return os.path.join(workdirs[0], name) if workdirs else ''


def perplexity_main(*, workdirs, lengths, step=None, dataset='', data_dir='', pile_subset='',
                    pile_dir='', protocol='blocks',
                    stride=None, max_tokens=None, tokens_per_batch=16384,
                    attention_impl=runs_lib.EVAL_ATTENTION_IMPL, block_size=0,
                    output=AUTO_OUTPUT, plot='', per_position=False, position_plot='',
                    command='') -> int:
  output = resolve_output(output, workdirs, 'perplexity.json')
  try:
    if not workdirs:
      raise ValueError('give at least one --workdir (a training run directory)')
    lengths = sweep.parse_lengths(lengths)
    sweep.check_protocol(protocol, stride)
    if tokens_per_batch < 1:
      raise ValueError(f'--tokens_per_batch={tokens_per_batch}: must be >= 1')
    for w in workdirs:  # fail fast on every workdir before any long work
      run_data = runs_lib.read_config(w).data
      dataset_fit.check_dataset(w, run_data.dataset, dataset)
      check_data_flags(run_data, dataset, pile_subset, pile_dir)
    check_outputs(output, plot, position_plot if per_position else '')
    entries, all_results = [], []
    for w in workdirs:
      start = time.perf_counter()
      run = runs_lib.load_run(w, step=step, attention_impl=attention_impl,
                              block_size=block_size or None)
      label = run.encoding
      print(f'{w}: {run.encoding}, step {run.step}, trained at length {run.train_length}, '
            f'mesh {dict(run.mesh.shape)}', flush=True)
      results = sweep.evaluate_run(
          run, lengths, protocol=protocol, stride=stride, max_tokens=max_tokens,
          tokens_per_batch=tokens_per_batch,
          data_config=data_config_for(run, dataset, data_dir, pile_subset, pile_dir),
          progress_factory=_tqdm_factory(run.encoding), per_position=per_position)
      entries.append(sweep.run_entry(label, run, results))
      all_results.append(results)
      print(ppl.format_table({f'{label} ({w}, {time.perf_counter() - start:.0f} s)': results}),
            flush=True)
  except (ValueError, FileNotFoundError) as e:
    return _error(str(e))
  labels = _unique_labels([e['label'] for e in entries], workdirs)
  for e, label in zip(entries, labels):
    e['label'] = label
  if len(entries) > 1:
    print('\nperplexity, side by side:')
    print(ppl.format_table(dict(zip(labels, all_results))), flush=True)
  document = sweep.results_document(entries, protocol=protocol, stride=stride,
                                    max_tokens=max_tokens, command=command)
  if output:
    print(f'wrote {sweep.write_json(document, output)}')
  if plot:
    print(f'wrote {sweep.plot_document(document, plot)}')
  if per_position and position_plot:
    from bipe_jax.evaluation import position_plot as position_plot_lib  # pylint: disable=g-import-not-at-top
    print(f'wrote {position_plot_lib.plot_document_positions(document, position_plot)}')
  return 0


def _unique_labels(labels, workdirs):
  import os  # pylint: disable=g-import-not-at-top
  return [l if labels.count(l) == 1 else f'{l} ({os.path.basename(os.path.normpath(w))})'
          for l, w in zip(labels, workdirs)]


def arithmetic_main(*, workdirs, per_length=100, batch_size=100, step=None,
                    attention_impl=runs_lib.EVAL_ATTENTION_IMPL, output='', command='') -> int:
  """Exact-match accuracy by number of operators, for runs trained on data.dataset=arithmetic:
  held-out problems of the training lengths and the longer evaluation problems."""
  from bipe_jax.evaluation import arithmetic_accuracy as acc  # pylint: disable=g-import-not-at-top
  from bipe_jax.tasks import arithmetic  # pylint: disable=g-import-not-at-top
  try:
    if not workdirs:
      raise ValueError('give at least one --workdir (a run trained on the arithmetic task)')
    if per_length < 1 or batch_size < 1:
      raise ValueError(f'--per_length={per_length} and --batch_size={batch_size} must be >= 1')
    for w in workdirs:
      config = runs_lib.read_config(w)
      if config.data.dataset != 'arithmetic':
        raise ValueError(f'workdir {w!r} was trained on data.dataset={config.data.dataset!r}, '
                         "not 'arithmetic' (configs/arithmetic_tiny.py)")
    check_outputs(output)
    tables, entries, train_max = {}, [], None
    for w in workdirs:
      start = time.perf_counter()
      run = runs_lib.load_run(w, step=step, attention_impl=attention_impl)
      settings = arithmetic.settings_from_config(run.config.data)
      train_max = settings.train_max_ops
      problems = arithmetic.problems_by_length(settings, 'test', per_length)
      problems.update(arithmetic.problems_by_length(settings, 'eval', per_length))
      with run.context():
        results = acc.accuracy_by_length(
            run.apply_fn(), run.params, problems, batch_size=batch_size,
            progress=lambda n, e=run.encoding: print(f'  {e}: {n} operators done', flush=True))
      label = run.encoding if run.encoding not in tables else f'{run.encoding} ({w})'
      tables[label] = results
      entries.append({'label': label, 'workdir': w, 'encoding': run.encoding, 'step': run.step,
                      'train_ops': [settings.train_min_ops, settings.train_max_ops],
                      'results': [r.to_dict() for r in results]})
      print(f'{w}: {run.encoding} step {run.step}, {time.perf_counter() - start:.0f} s',
            flush=True)
  except (ValueError, FileNotFoundError) as e:
    return _error(str(e))
  print('\nexact-match accuracy of the final answer (share of valid chains in parentheses), by number of '
        f'operators; training problems have <= {train_max}:')
  print(acc.format_accuracy_table(tables, train_max_ops=train_max), flush=True)
  if output:
    doc = sweep.results_document(entries, protocol='arithmetic-greedy', stride=None,
                                 max_tokens=None, command=command)
    doc['per_length'] = per_length
    storage.write_json(output, doc)
    print(f'wrote {output}')
  return 0


def passkey_main(*, workdirs, lengths, depths, trials=20, seed=0, batch_size=16, step=None,
                 attention_impl=runs_lib.EVAL_ATTENTION_IMPL, output=AUTO_OUTPUT, plot_path='',
                 command='') -> int:
  """Passkey retrieval accuracy by context length and depth for each run (its own tokenizer and
  separators; the synthetic task's samples for a run of data.dataset='passkey')."""
  output = resolve_output(output, workdirs, 'passkey.json')
  from bipe_jax.evaluation import passkey  # pylint: disable=g-import-not-at-top
  try:
    if not workdirs:
      raise ValueError('give at least one --workdir')
    if trials < 1 or batch_size < 1:
      raise ValueError(f'--trials={trials} and --batch_size={batch_size} must be >= 1')
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad or not depths or not lengths:
      raise ValueError(f'--depths must be in [0, 1] and --lengths non-empty; got depths '
                       f'{list(depths)}, lengths {list(lengths)}')
    for w in workdirs:  # fail fast on every workdir before any long work
      dataset_fit.check_passkey_probe(w, runs_lib.read_config(w).data.dataset)
    check_outputs(output, plot_path)
    results, entries, labels = {}, [], []
    for w in workdirs:
      start = time.perf_counter()
      run = runs_lib.load_run(w, step=step, attention_impl=attention_impl)
      with run.context():
        cells = passkey.probe(run.apply_fn(), run.params, passkey.row_function(run, seed),
                              lengths, depths, trials=trials, batch_size=batch_size)
      label = run.encoding if run.encoding not in labels else f'{run.encoding} ({w})'
      labels.append(label)
      results[label] = cells
      entries.append({'label': label, 'workdir': w, 'encoding': run.encoding, 'step': run.step,
                      'train_length': run.train_length, 'cells': [c.to_dict() for c in cells]})
      print(f'{w}: {run.encoding} step {run.step} (trained at {run.train_length}), '
            f'{time.perf_counter() - start:.0f} s', flush=True)
  except (ValueError, FileNotFoundError, runs_lib.RunError) as e:
    return _error(' '.join(str(e).split()))
  print('\npasskey retrieval: exact-match accuracy of the 5-digit key, by context length and '
        f'depth ({trials} trials per cell)')
  print(passkey.format_table(results), flush=True)
  if output:
    storage.write_json(output, {'command': command, 'trials': trials, 'seed': seed,
                                   'runs': entries})
    print(f'wrote {output}')
  if plot_path:
    print(f'wrote {passkey.plot_heatmaps(results, plot_path)}')
  return 0


def scrolls_main(*, workdir, split='validation', max_examples=0, max_new_tokens=64,
                 batch_size=8, step=None, output='', command='') -> int:
  """Greedy answers of a SCROLLS fine-tune on a split, scored with the subset's metric."""
  from bipe_jax.evaluation import scrolls  # pylint: disable=g-import-not-at-top
  from bipe_jax.tasks import scrolls as scrolls_task  # pylint: disable=g-import-not-at-top
  try:
    if max_new_tokens < 1 or batch_size < 1 or max_examples < 0:
      raise ValueError(f'--max_new_tokens={max_new_tokens} and --batch_size={batch_size} must '
                       f'be >= 1, --max_examples={max_examples} >= 0')
    config = runs_lib.read_config(workdir)
    if config.data.dataset != scrolls_task.DATASET_NAME:
      raise ValueError(f'workdir {workdir!r} was trained on data.dataset='
                       f"{config.data.dataset!r}, not 'scrolls' (configs/scrolls_finetune.py)")
    check_outputs(output)
    run = runs_lib.load_run(workdir, step=step, attention_impl='dense')
    examples = scrolls_task.read_examples(run.config.data, split)
    references = scrolls.references_by_id(examples)
    if max_examples:
      keep = list(references)[:max_examples]
      references = {i: references[i] for i in keep}
      examples = [e for e in examples if e['id'] in references]
    start = time.perf_counter()
    answers = scrolls.generate_answers(run, examples, max_new_tokens=max_new_tokens,
                                       batch_size=batch_size)
    subset = scrolls_task.settings(run.config.data)['subset']
    result = scrolls.score(subset, answers, references)
  except (ValueError, FileNotFoundError, runs_lib.RunError) as e:
    return _error(' '.join(str(e).split()))
  print(f'{workdir}: step {run.step}, {subset} {split}: {result["metric"]} '
        f'{result["score"]:.2f} over {result["count"]} ids '
        f'({time.perf_counter() - start:.0f} s)', flush=True)
  if output:
    storage.write_json(output, {'command': command, 'workdir': workdir, 'step': run.step,
                                   'subset': subset, 'split': split, **result,
                                   'answers': answers})
    print(f'wrote {output}')
  return 0
