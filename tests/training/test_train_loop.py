"""The training loop's order of work (bipe_jax/training/train_loop.py), on a fake step function:
scalars fetched one step late, actions due by period / at the end / on a stop request, run in
order, with this step's scalars fetched first when they need them."""

from bipe_jax.training import train_loop as L


def _loop(total_batches=100, stop_at=None, actions=()):
  events = []
  batches = iter(range(total_batches))
  scalars = L.Scalars(lambda step, s: events.append(('scalars', step, s['loss'])),
                      fetch=lambda device: {'loss': device})

  def step_fn(state, batch):
    events.append(('dispatch', state + 1))
    return state + 1, float(batch)

  def action(name, **kw):
    return L.PeriodicAction(name, lambda info: events.append((name, info.step, info.state)),
                            **kw)

  loop = L.TrainLoop(step_fn=step_fn, next_batch=lambda: next(batches), scalars=scalars,
                     actions=[action(n, **kw) for n, kw in actions],
                     should_stop=lambda step: step == stop_at,
                     on_first_dispatch=lambda: events.append(('first',)))
  return loop, events


def test_scalars_are_fetched_one_step_late_and_each_once():
  loop, events = _loop()
  end = loop.run(0, 0, 3)
  assert end == L.LoopEnd(state=3, step=3, exhausted=False, stopped=False)
  assert events == [('dispatch', 1), ('first',), ('dispatch', 2), ('scalars', 1, 0.0),
                    ('dispatch', 3), ('scalars', 2, 1.0), ('scalars', 3, 2.0)]


def test_actions_run_when_due_in_order_with_their_scalars_fetched_first():
  loop, events = _loop(actions=[('eval', dict(every=2, at_end=True, needs_scalars=True)),
                                ('save', dict(every=3, at_end=True, on_stop=True)),
                                ('notice', dict(on_stop=True))])
  loop.run(10, 10, 15)  # resumed at step 10: steps 11..15
  acted = [e for e in events if e[0] in ('eval', 'save', 'notice', 'scalars')]
  # 12: eval (every 2; step 12's scalars fetched first), then save (every 3); 15: the end.
  assert acted == [('scalars', 11, 0.0), ('scalars', 12, 1.0), ('eval', 12, 12),
                   ('save', 12, 12), ('scalars', 13, 2.0), ('scalars', 14, 3.0), ('eval', 14, 14),
                   ('scalars', 15, 4.0), ('eval', 15, 15), ('save', 15, 15)]
  assert events.index(('first',)) == 1  # logged once, after the first dispatch


def test_a_stop_request_runs_the_due_actions_and_ends_the_loop():
  loop, events = _loop(stop_at=4, actions=[('save', dict(every=100, on_stop=True)),
                                           ('notice', dict(on_stop=True))])
  end = loop.run(0, 0, 50)
  assert end == L.LoopEnd(state=4, step=4, exhausted=False, stopped=True)
  assert [e for e in events if e[0] in ('save', 'notice')] == [('save', 4, 4), ('notice', 4, 4)]
  assert events[-1] == ('scalars', 4, 3.0)  # every dispatched step's scalars are consumed


def test_data_that_ends_early_reports_the_last_trained_step():
  loop, events = _loop(total_batches=2, actions=[('save', dict(at_end=True))])
  end = loop.run(0, 0, 5)
  assert end == L.LoopEnd(state=2, step=2, exhausted=True, stopped=False)
  assert not any(e[0] == 'save' for e in events)  # not the end of the run: the caller saves
  assert events[-1] == ('scalars', 2, 1.0)


def test_nothing_to_do_when_the_run_is_already_complete():
  loop, events = _loop(actions=[('save', dict(at_end=True))])
  assert loop.run(7, 5, 5) == L.LoopEnd(state=7, step=5, exhausted=False, stopped=False)
  assert events == []
