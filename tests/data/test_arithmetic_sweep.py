"""The arithmetic sweep driver: grid, per-run config, stopping rule, resume, tables, plumbing."""

import dataclasses
import json
import os

import pytest

from bipe_jax.evaluation import arithmetic_accuracy as acc
from bipe_jax.evaluation import arithmetic_sweep as S
from configs import arithmetic_tiny


def test_plan_grid_and_validation():
  plan = S.SweepPlan(encodings=('rope', 'bipe_rope'), layers=(1, 2), max_ops=(4,))
  assert plan.runs() == [('rope', 1, 4), ('bipe_rope', 1, 4), ('rope', 2, 4),
                         ('bipe_rope', 2, 4)]
  assert S.run_name('bipe_rope', 2, 5) == 'bipe_rope_L2_N5'
  for kw, match in [({'chunk_steps': 0}, 'chunk_steps'), ({'extra_ops': 0}, 'extra_ops'),
                    ({'target_accuracy': 1.5}, 'target_accuracy'), ({'layers': ()}, 'layers'),
                    ({'max_ops': (4, 0)}, 'max_ops')]:
    with pytest.raises(ValueError, match=match):
      S.SweepPlan(**kw)


def test_run_config_sets_the_grid_point_and_fits_the_longest_problem():
  base = arithmetic_tiny.get_config('bipe_rope')
  plan = S.SweepPlan(chunk_steps=300, extra_ops=3)
  c = S.run_config(base, 'rope', 2, 5, plan)
  assert c.model.position_encoding == 'rope' and c.model.num_layers == 2
  assert (c.data.arithmetic_train_max_ops, c.data.arithmetic_eval_max_ops) == (5, 8)
  assert c.train.schedule == 'constant' and c.checkpoint.every_steps == 300
  assert c.data.seq_len == 128  # 1..5 operators fit (at most 73 tokens)
  assert S.run_config(base, 'rope', 1, 7, plan).data.seq_len == 192  # 7 operators: 129 tokens
  assert base.model.position_encoding == 'bipe_rope' and base.data.seq_len == 128  # untouched


@pytest.mark.parametrize('accs,steps,expected', [
    ([0.2, 0.5, 0.996], 1500, 'target'),
    ([0.2, 0.5, 0.8, 0.805, 0.79, 0.8], 3000, None),  # patience 4: not yet
    ([0.2, 0.5, 0.8, 0.805, 0.79, 0.8, 0.805], 3500, 'plateau'),
    ([0.2, 0.5, 0.8, 0.805, 0.79, 0.8, 0.82], 3500, None),  # improved by >= 0.01
    ([0.1, 0.2], 4000, 'max_steps'),
])
def test_stop_reason(accs, steps, expected):
  plan = S.SweepPlan(patience=4, min_delta=0.01, target_accuracy=0.995, max_steps=4000)
  assert S.stop_reason(accs, steps, plan) == expected


class FakeTraining:
  """train_fn / accuracy_fn stand-ins: accuracy follows a given curve of the trained steps."""

  def __init__(self, curve):
    self.curve, self.trained, self.scored = curve, [], []

  def train(self, config, workdir):
    self.trained.append((os.path.basename(workdir), config.train.steps))

  def accuracy(self, workdir, problems):
    steps = [s for w, s in self.trained if w == os.path.basename(workdir)][-1]
    self.scored.append(sorted(problems))
    a = self.curve(steps)
    return [acc.LengthAccuracy(n, 10, round(10 * a), round(10 * a), 9.0) for n in sorted(problems)]


def test_train_to_convergence_stops_on_a_plateau_and_resumes_from_its_curve(tmp_path):
  plan = S.SweepPlan(chunk_steps=100, patience=2, min_delta=0.05, max_steps=10_000,
                     per_length=3)
  fake = FakeTraining(lambda s: min(s, 300) / 1000)  # 0.1, 0.2, 0.3, 0.3, 0.3
  config = S.run_config(arithmetic_tiny.get_config(), 'rope', 1, 4, plan)
  workdir = str(tmp_path / 'run')
  curve = S.train_to_convergence(config, workdir, plan, train_fn=fake.train,
                                 accuracy_fn=fake.accuracy, log=lambda s: None)
  assert curve == {'steps': [100, 200, 300, 400, 500], 'accuracy': [0.1, 0.2, 0.3, 0.3, 0.3],
                   'stopped': 'plateau'}
  assert fake.scored == [[4]] * 5  # checks score N = 4 operators only
  assert json.load(open(os.path.join(workdir, S.CURVE_FILE))) == curve
  again = FakeTraining(lambda s: 1.0)
  assert S.train_to_convergence(config, workdir, plan, train_fn=again.train,
                                accuracy_fn=again.accuracy, log=lambda s: None) == curve
  assert again.trained == []  # a stopped run is not trained again


def test_a_raised_max_steps_continues_a_capped_run_but_not_a_plateaued_one(tmp_path):
  config = S.run_config(arithmetic_tiny.get_config(), 'rope', 1, 4, S.SweepPlan())
  quiet = lambda s: None  # pylint: disable=unnecessary-lambda-assignment
  rising = FakeTraining(lambda s: s / 1000)
  capped = S.SweepPlan(chunk_steps=100, patience=2, max_steps=200, per_length=3)
  workdir = str(tmp_path / 'rising')
  curve = S.train_to_convergence(config, workdir, capped, train_fn=rising.train,
                                 accuracy_fn=rising.accuracy, log=quiet)
  assert curve['stopped'] == 'max_steps' and curve['steps'] == [100, 200]
  raised = dataclasses.replace(capped, max_steps=400)
  logged = []
  curve = S.train_to_convergence(config, workdir, raised, train_fn=rising.train,
                                 accuracy_fn=rising.accuracy, log=logged.append)
  assert curve == {'steps': [100, 200, 300, 400], 'accuracy': [0.1, 0.2, 0.3, 0.4],
                   'stopped': 'max_steps'}
  assert [s for _, s in rising.trained] == [100, 200, 300, 400]  # from the checkpoint on
  assert 'continuing to max_steps=400' in logged[0]
  # A curve that already meets the new plan's plateau rule (patience 2) stays stopped.
  flat = FakeTraining(lambda s: 0.5)
  workdir = str(tmp_path / 'flat')
  capped3 = dataclasses.replace(capped, max_steps=300, patience=3)
  assert S.train_to_convergence(config, workdir, capped3, train_fn=flat.train,
                                accuracy_fn=flat.accuracy, log=quiet)['stopped'] == 'max_steps'
  again = FakeTraining(lambda s: 1.0)
  curve = S.train_to_convergence(config, workdir, raised, train_fn=again.train,
                                 accuracy_fn=again.accuracy, log=quiet)
  assert curve['stopped'] == 'plateau' and curve['steps'] == [100, 200, 300]
  assert again.trained == []
  assert json.load(open(os.path.join(workdir, S.CURVE_FILE)))['stopped'] == 'plateau'


def test_a_preempted_chunk_stops_the_sweep_without_a_check_and_resumes(tmp_path):
  from bipe_jax.training import trainer  # pylint: disable=g-import-not-at-top
  plan = S.SweepPlan(encodings=('rope',), layers=(1,), max_ops=(3,), chunk_steps=100,
                     max_steps=300, per_length=2, final_per_length=2, extra_ops=1)

  class PreemptedAt(FakeTraining):
    """Trains normally until the chunk ending at `stop`, which SIGTERM cuts at step stop - 40."""

    def __init__(self, stop):
      super().__init__(lambda s: s / 1000)
      self.stop = stop

    def train(self, config, workdir):
      super().train(config, workdir)
      done = config.train.steps
      preempted = done == self.stop
      return trainer.TrainResult(step=done - 40 if preempted else done, start_step=0, losses={},
                                 preempted=preempted, checkpoint_steps=[])

  cut = PreemptedAt(stop=200)
  with pytest.raises(S.SweepPreempted, match=r'rope_L1_N3: preempted at step 160 .* step 200'):
    S.sweep(plan, arithmetic_tiny.get_config(), str(tmp_path), train_fn=cut.train,
            accuracy_fn=cut.accuracy, log=lambda s: None)
  assert cut.scored == [[3]]  # the check after step 100 only: none for the cut chunk
  curve_path = tmp_path / 'rope_L1_N3' / S.CURVE_FILE
  assert json.load(open(curve_path)) == {'steps': [100], 'accuracy': [0.1], 'stopped': None}
  assert not (tmp_path / S.RESULTS_FILE).exists()  # no final scoring of a half-trained run
  again = PreemptedAt(stop=None)
  doc = S.sweep(plan, arithmetic_tiny.get_config(), str(tmp_path), train_fn=again.train,
                accuracy_fn=again.accuracy, log=lambda s: None)
  assert [s for _, s in again.trained] == [200, 300]  # the cut chunk again, from its checkpoint
  assert doc['runs'][0]['curve']['steps'] == [100, 200, 300]


def test_sweep_writes_every_run_and_formats_the_tables(tmp_path, capsys):
  plan = S.SweepPlan(encodings=('rope', 'bipe_rope'), layers=(1, 2), max_ops=(3,),
                     chunk_steps=50, max_steps=100, per_length=2, final_per_length=2,
                     extra_ops=1)
  fake = FakeTraining(lambda s: s / 100)
  doc = S.sweep(plan, arithmetic_tiny.get_config(), str(tmp_path), train_fn=fake.train,
                accuracy_fn=fake.accuracy)
  assert [r['name'] for r in doc['runs']] == ['rope_L1_N3', 'bipe_rope_L1_N3', 'rope_L2_N3',
                                              'bipe_rope_L2_N3']
  assert all(r['stopped'] == 'target' and r['steps'] == 100 for r in doc['runs'])
  assert [x['num_ops'] for x in doc['runs'][0]['results']] == [1, 2, 3, 4]
  assert json.load(open(tmp_path / S.RESULTS_FILE)) == doc
  md = S.format_tables(doc)
  assert '| 3 | 1 | 1.000 (100 steps) | 1.000 (100 steps) |' in md
  assert '| operators | rope N=3 | bipe_rope N=3 |' in md and '| 4 | 1.000 | 1.000 |' in md
  assert 'bipe_rope_L2_N3: done at step 100 (target)' in capsys.readouterr().out


@pytest.mark.slow
def test_sweep_with_the_real_trainer_continues_chunk_by_chunk(tmp_path):
  from bipe_jax.training import trainer  # pylint: disable=g-import-not-at-top
  base = arithmetic_tiny.get_config()
  m = base.model
  m.hidden_size, m.num_heads, m.ffn_size = 32, 2, 64
  base.data.seq_len = 64
  base.train.batch_size, base.train.warmup_steps, base.train.log_every = 4, 2, 100
  base.checkpoint.async_save = False
  base.mesh.data = 1
  plan = S.SweepPlan(encodings=('bipe_rope',), layers=(1,), max_ops=(2,), chunk_steps=3,
                     max_steps=6, per_length=2, final_per_length=2, extra_ops=1,
                     target_accuracy=1.0, patience=5)
  scored = []

  def accuracy(workdir, problems):
    scored.append(sorted(problems))
    return S.workdir_accuracy(workdir, problems, batch_size=4)

  doc = S.sweep(plan, base, str(tmp_path), train_fn=trainer.train, accuracy_fn=accuracy,
                log=lambda s: None)
  run, = doc['runs']
  assert run['curve']['steps'] == [3, 6] and run['stopped'] in ('max_steps', 'target')
  assert scored == [[2], [2], [1, 2, 3]]
  assert sorted(os.listdir(tmp_path / 'bipe_rope_L1_N2' / 'checkpoints')) == ['3', '6']
  metrics = [json.loads(l) for l in open(tmp_path / 'bipe_rope_L1_N2' / 'metrics.jsonl')]
  assert {m['step'] for m in metrics if 'loss' in m} >= {6}
