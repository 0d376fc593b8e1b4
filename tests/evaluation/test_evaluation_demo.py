"""The demo's plan: the training command it runs, validation, the estimate and the report."""

import dataclasses
import math
import os

import pytest

from bipe_jax.evaluation import demo


def test_train_command_sets_the_short_length_and_steps(tmp_path):
  plan = demo.DemoPlan(seq_len=32, steps=40, output_dir=str(tmp_path), data_dir='/d')
  cmd = plan.train_command('bipe_alibi')
  assert cmd[1].endswith('train/main.py')
  flags = dict(a[2:].split('=', 1) for a in cmd[2:])
  assert flags['config'].endswith('configs/tiny.py')
  assert flags['workdir'] == str(tmp_path / 'runs' / 'bipe_alibi')
  assert flags['config.model.position_encoding'] == 'bipe_alibi'
  assert flags['config.data.seq_len'] == '32' and flags['config.train.steps'] == '40'
  assert flags['config.model.max_intra'] == '32'
  assert flags['config.checkpoint.every_steps'] == '40'
  assert flags['config.data.data_dir'] == '/d'
  assert plan.lengths == [32, 64, 128, 256, 512]


@pytest.mark.parametrize('kw,match', [
    ({'encodings': ('rope', 'bogus')}, 'bogus'),
    ({'steps': 0}, 'steps'),
    ({'multipliers': ()}, 'multipliers'),
    ({'max_tokens': 100}, 'max_tokens'),
    ({'parallel': 0}, 'parallel'),
    ({'cpu_devices': 0}, 'cpu_devices'),
    ({'cpu_devices': 3, 'batch_size': 32}, 'divide'),
])
def test_bad_plans_name_the_flag(kw, match):
  with pytest.raises(ValueError, match=match):
    demo.DemoPlan(**kw).validate()


def test_estimate_skips_finished_runs(tmp_path):
  plan = demo.DemoPlan(encodings=('rope', 'alibi'), steps=100, output_dir=str(tmp_path),
                       parallel=1)
  both = demo.estimate_seconds(plan, data_ready=True)
  (tmp_path / 'runs' / 'rope' / 'checkpoints' / '100').mkdir(parents=True)
  one = demo.estimate_seconds(plan, data_ready=True)
  per_run = demo.SECONDS_TRAIN_STARTUP + 100 * demo.SECONDS_PER_STEP
  assert math.isclose(both - one, per_run)
  assert math.isclose(demo.estimate_seconds(plan, data_ready=False) - one, demo.SECONDS_PREPARE)


def test_estimate_side_by_side_runs_in_waves_of_two(tmp_path):
  plan = demo.DemoPlan(encodings=('rope', 'bipe_rope', 'alibi'), steps=100, parallel=2,
                       output_dir=str(tmp_path))
  train_only = demo.estimate_seconds(plan, data_ready=True) - len(plan.encodings) * (
      demo.SECONDS_EVAL_STARTUP + len(plan.lengths) * plan.max_tokens
      / demo.EVAL_TOKENS_PER_SECOND)
  wave = demo.SECONDS_TRAIN_STARTUP + 100 * demo.SECONDS_PER_STEP_SIDE_BY_SIDE
  assert math.isclose(train_only, 2 * wave)  # three runs, two at a time


def test_side_by_side_runs_get_one_thread_each_and_keep_user_flags():
  plan = demo.DemoPlan(parallel=2)
  env = demo.train_environment(plan, {'XLA_FLAGS': '--xla_dump_to=/tmp/x', 'HOME': '/h'})
  assert env['XLA_FLAGS'].startswith('--xla_dump_to=/tmp/x ')
  assert '--xla_cpu_multi_thread_eigen=false' in env['XLA_FLAGS'] and env['NPROC'] == '1'
  assert env['HOME'] == '/h'
  assert 'XLA_FLAGS' not in demo.train_environment(demo.DemoPlan(parallel=1), {})
  assert '--cpu_devices=1' in plan.train_command('rope')
  assert '--cpu_devices=2' in demo.DemoPlan(parallel=1, cpu_devices=2).train_command('rope')
  mine = {'NPROC': '2'}
  assert demo.train_environment(plan, mine)['NPROC'] == '2'
  assert 'XLA_FLAGS' not in demo.train_environment(plan, mine)


def test_budget_is_the_same_flags_for_every_encoding():
  plan = demo.DemoPlan(steps=50, seq_len=32, batch_size=8, learning_rate=1e-3)
  def budget_flags(encoding):
    return {a for a in plan.train_command(encoding)[2:]
            if a.split('=')[0] in ('--config.train.steps', '--config.data.seq_len',
                                   '--config.train.batch_size', '--config.train.learning_rate',
                                   '--config.train.warmup_steps')}
  assert budget_flags('rope') == budget_flags('bipe_alibi')
  assert '--config.train.learning_rate=0.001' in budget_flags('rope')
  assert '--config.train.warmup_steps=5' in budget_flags('rope')
  assert plan.budget['tokens'] == 50 * 32 * 8
  assert '50 steps x 8 sequences x 32 tokens' in plan.budget_line()


def test_paper_comparison_states_both_verdicts():
  plan = demo.DemoPlan(seq_len=64)
  ppl = {'rope': {512: 100.0, 1024: 200.0}, 'bipe_rope': {512: 95.0, 1024: 150.0},
         'alibi': {1024: 50.0}}
  lines = demo.paper_comparison(plan, ppl)
  assert lines == [
      'bipe_rope / rope at 8x (512 tokens): 0.950 (target <= 0.9) — does NOT hold',
      'bipe_rope / rope at 16x (1024 tokens): 0.750 (target <= 0.8) — holds',
  ]  # bipe_alibi was not run: no line for it


def test_markdown_report_has_table_command_and_date():
  plan = demo.DemoPlan(encodings=('rope', 'bipe_rope'), seq_len=64, steps=10)
  doc = {'date': '2026-11-22 06:00 UTC', 'runs': [
      {'label': 'rope', 'results': [dict(length=64, blocks=2, tokens=126, nll_sum=126 * 2.0)]},
      {'label': 'bipe_rope',
       'results': [dict(length=64, blocks=2, tokens=126, nll_sum=126 * 1.5)]}]}
  md = demo.markdown_report(plan, doc, command='python eval/demo.py', wall_seconds=600,
                            train_seconds={'rope': 100, 'bipe_rope': 0.0},
                            eval_seconds={'rope': 5, 'bipe_rope': 6})
  assert '2026-11-22' in md and '`python eval/demo.py`' in md and '10.0 min' in md
  assert 'rope 100 s + eval 5 s, bipe_rope reused from an earlier run + eval 6 s' in md
  assert plan.budget_line() in md
  assert '| length | tokens scored | rope | bipe_rope |' in md
  assert f'| 64 | 126 | {math.exp(2.0):.2f} | {math.exp(1.5):.2f} |' in md


def test_make_demo_trains_the_rope_pair_and_demo_all_adds_the_alibi_pair():
  """`make demo` (no --encodings) trains rope and bipe_rope; `make demo-all` names all four
  encodings, into the same output folder (so it reuses the two runs `make demo` made)."""
  assert demo.DemoPlan().encodings == ('rope', 'bipe_rope')
  recipes = _makefile_recipes()
  (demo_cmd,), (all_cmd,) = recipes['demo'], recipes['demo-all']
  assert '--encodings' not in demo_cmd
  flag = [a for a in all_cmd.split() if a.startswith('--encodings=')][0]
  assert demo.parse_names(flag.split('=', 1)[1]) == demo.ALL_ENCODINGS
  assert set(demo.ALL_ENCODINGS) >= set(demo.DEFAULT_ENCODINGS)
  out_dir = lambda cmd: [a for a in cmd.split() if a.startswith('--output_dir=')]
  assert out_dir(demo_cmd) == out_dir(all_cmd) == ['--output_dir=demo_out']


def _makefile_recipes() -> dict[str, list[str]]:
  with open(os.path.join(demo.ROOT, 'Makefile')) as f:
    recipes, target = {}, None
    for line in f:
      if line and not line[0].isspace() and ':' in line:
        target = line.split(':')[0]
      elif line.startswith('\t') and target:
        recipes.setdefault(target, []).append(line.strip())
  return recipes


def test_make_demo_dape_trains_the_kerple_trio_to_64x_in_its_own_folder():
  """`make demo-dape`: kerple, dape_kerple, bipe_dape_kerple with the DAPE plan's steps,
  evaluated at 1x..64x, into demo_dape_out (not the BiPE demo's folder: other steps)."""
  (cmd,) = _makefile_recipes()['demo-dape']
  flags = dict(a[2:].split('=', 1) for a in cmd.split() if a.startswith('--'))
  assert demo.parse_names(flags['encodings']) == demo.DAPE_ENCODINGS
  assert int(flags['steps']) == demo.DAPE_STEPS
  assert demo.parse_ints(flags['multipliers'], 'multipliers') == demo.DAPE_MULTIPLIERS
  assert max(demo.DAPE_MULTIPLIERS) == 64 and flags['output_dir'] == 'demo_dape_out'
  assert demo.parse_names(flags['extra_protocols']) == ('last:256',)  # DAPE's protocol too
  assert set(flags) == {'output_dir', 'encodings', 'steps', 'multipliers',
                        'extra_protocols'}  # else the demo's
  plan = demo.DemoPlan(encodings=demo.DAPE_ENCODINGS, steps=demo.DAPE_STEPS,
                       multipliers=demo.DAPE_MULTIPLIERS, extra_protocols=('last:256',))
  plan.validate()  # 64x the demo's length fits the validation tokens it scores
  assert plan.lengths[-1] == 64 * plan.seq_len <= plan.max_tokens
  assert demo.DemoPlan().steps == 1500  # the BiPE demo's budget is unchanged


def test_dape_claims_are_checked_and_the_new_pair_has_no_verdict():
  plan = demo.DemoPlan(seq_len=64, multipliers=demo.DAPE_MULTIPLIERS)
  ppl = {'kerple': {64: 30.0, 4096: 100.0}, 'dape_kerple': {64: 29.0, 4096: 45.0},
         'bipe_dape_kerple': {64: 28.0, 4096: 36.0}}
  assert demo.paper_comparison(plan, ppl) == [
      'dape_kerple / kerple at 1x (64 tokens): 0.967 (target <= 1.0) — holds',
      'dape_kerple / kerple at 64x (4096 tokens): 0.450 (target <= 0.4) — does NOT hold',
      'bipe_dape_kerple / dape_kerple at 64x (4096 tokens): 0.800 (in neither paper: no target)',
      'bipe_dape_kerple / kerple at 64x (4096 tokens): 0.360 (in neither paper: no target)',
  ]


def test_estimate_counts_a_dape_step_as_several_plain_ones(tmp_path):
  def train_seconds(encoding):
    plan = demo.DemoPlan(encodings=(encoding,), steps=100, output_dir=str(tmp_path))
    return demo.estimate_seconds(plan, data_ready=True) - demo.estimate_seconds(
        dataclasses.replace(plan, steps=1), data_ready=True)
  assert math.isclose(train_seconds('dape_kerple'),
                      demo.TRANSFORM_STEP_COST * train_seconds('kerple'))
  assert math.isclose(train_seconds('kerple'), 99 * demo.SECONDS_PER_STEP)


def _fake_training(monkeypatch, script: str):
  """Makes the demo's training subprocess `python -c script` (run in the run's workdir)."""
  import sys  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(demo.DemoPlan, 'train_command',
                      lambda self, e: [sys.executable, '-c', script, self.workdir(e)])
  monkeypatch.setattr(demo, '_stopping', __import__('threading').Event())


_SAVE_AT = ('import os, sys\n'
            'def save(step):\n'
            '  os.makedirs(os.path.join(sys.argv[1], "checkpoints", str(step)))\n')


def test_a_run_that_ends_before_its_last_step_is_not_evaluated(tmp_path, monkeypatch):
  _fake_training(monkeypatch, _SAVE_AT + 'save(7)\n')  # exit code 0, as a preempted trainer
  plan = demo.DemoPlan(steps=40, output_dir=str(tmp_path))
  with pytest.raises(RuntimeError, match='training rope stopped at step 7 of 40 .*preempted'):
    demo.train_run(plan, 'rope', log=lambda s: None)
  _fake_training(monkeypatch, _SAVE_AT + 'save(40)\n')
  assert demo.train_run(plan, 'rope', log=lambda s: None) > 0  # the finished run passes


def test_sigterm_reaches_the_training_runs_and_no_new_run_starts(tmp_path, monkeypatch):
  import threading  # pylint: disable=g-import-not-at-top
  _fake_training(monkeypatch, _SAVE_AT + (
      'import signal, time\n'
      'signal.signal(signal.SIGTERM, lambda *_: (save(3), sys.exit(0)))\n'
      'print("ready", flush=True)\n'
      'time.sleep(60)\n'
      'save(40)\n'))
  plan = demo.DemoPlan(steps=40, output_dir=str(tmp_path))
  ready, errors = threading.Event(), []

  def train():
    try:
      demo.train_run(plan, 'rope', log=lambda s: ready.set() if s.endswith('ready') else None)
    except RuntimeError as e:
      errors.append(str(e))

  worker = threading.Thread(target=train)
  worker.start()
  assert ready.wait(30)
  demo.terminate_training_runs()
  worker.join(30)
  assert not worker.is_alive()
  assert len(errors) == 1 and 'stopped at step 3 of 40' in errors[0]
  with pytest.raises(RuntimeError, match='stopped .SIGTERM. before training bipe_rope'):
    demo.train_run(plan, 'bipe_rope', log=lambda s: None)
  assert not os.path.exists(plan.workdir('bipe_rope'))


def test_make_demo_segments_runs_natural_fixed_and_hierarchical_bipe():
  """`make demo-segments`: bipe_rope on natural segments, on fixed-length ones of the corpus's
  mean length (resolved at start), and hierarchical BiPE, in the demo's budget."""
  from bipe_jax.evaluation import segment_runs  # pylint: disable=g-import-not-at-top
  (cmd,) = _makefile_recipes()['demo-segments']
  flags = dict(a[2:].split('=', 1) for a in cmd.split() if a.startswith('--'))
  labels = demo.parse_names(flags['encodings'])
  assert labels == ('bipe_rope', 'bipe_rope@fixed:auto', 'bipe3_rope')
  assert set(flags) == {'output_dir', 'encodings'}  # the demo's own budget and protocol
  plan = demo.DemoPlan(encodings=segment_runs.resolve_auto(labels, 12))
  plan.validate()
  command = plan.train_command('bipe_rope@fixed:12')
  assert command[-1] == '--config.model.separators=fixed:12'
  assert '--config.model.position_encoding=bipe_rope' in command
  assert f'--workdir={plan.workdir("bipe_rope@fixed:12")}' in command
  assert plan.workdir('bipe_rope@fixed:12').endswith('/runs/bipe_rope-fixed12')
  for bad in ('bipe_rope@fixed:x', 'nope_x@sentence', 'bipe_rope@words'):
    with pytest.raises(ValueError):
      demo.DemoPlan(encodings=(bad,)).validate()


def test_mean_segment_length_hand_example():
  from bipe_jax.evaluation import segment_runs  # pylint: disable=g-import-not-at-top
  # 10 tokens, separators 3 and 4 at three places: 10 / 3 tokens per segment.
  assert segment_runs.mean_segment_length([[5, 3, 5, 5, 4], [5, 5, 5, 3, 5]], (3, 4)) == 10 / 3
  with pytest.raises(ValueError, match='no separator'):
    segment_runs.mean_segment_length([5, 5], (3,))
