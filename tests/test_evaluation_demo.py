"""The demo's plan: the training command it runs, validation, the estimate and the report."""

import math

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
])
def test_bad_plans_name_the_flag(kw, match):
  with pytest.raises(ValueError, match=match):
    demo.DemoPlan(**kw).validate()


def test_estimate_skips_finished_runs(tmp_path):
  plan = demo.DemoPlan(encodings=('rope', 'alibi'), steps=100, output_dir=str(tmp_path))
  both = demo.estimate_seconds(plan, data_ready=True)
  (tmp_path / 'runs' / 'rope' / 'checkpoints' / '100').mkdir(parents=True)
  one = demo.estimate_seconds(plan, data_ready=True)
  per_run = demo.SECONDS_TRAIN_STARTUP + 100 * demo.SECONDS_PER_STEP
  assert math.isclose(both - one, per_run)
  assert math.isclose(demo.estimate_seconds(plan, data_ready=False) - one, demo.SECONDS_PREPARE)


def test_markdown_report_has_table_command_and_date():
  plan = demo.DemoPlan(encodings=('rope', 'bipe_rope'), seq_len=64, steps=10)
  doc = {'date': '2026-11-22 06:00 UTC', 'runs': [
      {'label': 'rope', 'results': [dict(length=64, blocks=2, tokens=126, nll_sum=126 * 2.0)]},
      {'label': 'bipe_rope',
       'results': [dict(length=64, blocks=2, tokens=126, nll_sum=126 * 1.5)]}]}
  md = demo.markdown_report(plan, doc, command='python eval/demo.py', wall_seconds=600,
                            train_seconds={'rope': 100, 'bipe_rope': 110},
                            eval_seconds={'rope': 5, 'bipe_rope': 6})
  assert '2026-11-22' in md and '`python eval/demo.py`' in md and '10.0 min' in md
  assert '| length | tokens scored | rope | bipe_rope |' in md
  assert f'| 64 | 126 | {math.exp(2.0):.2f} | {math.exp(1.5):.2f} |' in md
