"""The asynchronous timeline (`tff_fedadamom.asynchrony`): hand-computed steps, the
synchronous special case, staleness bounds, the versions a run must keep, and
the staleness weights' formulas."""

import itertools

import numpy as np
import pytest

from tff_fedadamom import asynchrony
from tff_fedadamom.asynchrony import Timeline, staleness_weight
from tff_fedadamom.data.sampling import sample_clients

IDS = [f"c{i}" for i in range(12)]
CONSTANT = {"kind": "constant"}


def _staleness(timeline, steps):
  return [timeline.step(s).staleness() for s in range(1, steps + 1)]


def test_equal_concurrency_buffer_and_durations_is_the_synchronous_sampler():
  timeline = Timeline(IDS, 4, 4, 0, CONSTANT, seed=5)
  for r in range(1, 7):
    step = timeline.step(r)
    assert [t.client for t in step.tasks] == sample_clients(IDS, 4, 5, r)
    assert [t.launch for t in step.tasks] == [r] * 4  # the data's round number
    assert step.staleness() == [0] * 4 and step.time == float(r) and step.dropped == 0


def test_two_clients_one_update_per_step_by_hand():
  # Both start at 0 from version 0 and arrive at 1 (in start order): the first
  # makes step 1, the second, one step stale, step 2. Both restart at 1 from
  # version 2, and so on.
  timeline = Timeline(IDS, 2, 1, 5, CONSTANT, seed=0)
  assert _staleness(timeline, 6) == [[0], [1]] * 3
  assert [timeline.step(s).time for s in range(1, 7)] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
  assert [t.version for t in (timeline.step(3).tasks[0], timeline.step(4).tasks[0])] == [2, 2]


def test_updates_staler_than_the_limit_are_dropped_and_counted():
  # As above with max_staleness 0: each second arrival is one step stale.
  timeline = Timeline(IDS, 2, 1, 0, CONSTANT, seed=0)
  assert _staleness(timeline, 3) == [[0], [0], [0]]
  assert [timeline.step(s).dropped for s in (1, 2, 3)] == [0, 1, 1]
  assert [timeline.step(s).time for s in (1, 2, 3)] == [1.0, 2.0, 3.0]


def test_a_timeline_is_a_function_of_its_arguments_and_seed():
  durations = {"kind": "lognormal", "sigma": 1.0, "jitter": 0.5}

  def steps(seed):
    timeline = Timeline(IDS, 6, 2, 4, durations, seed)
    return [(s.time, [(t.client, t.version, t.launch) for t in s.tasks])
            for s in (timeline.step(n) for n in range(1, 15))]

  assert steps(1) == steps(1)
  assert steps(1) != steps(2)


@pytest.mark.parametrize("concurrency,buffer_size,max_staleness,kind",
                         itertools.product([1, 3, 7], [1, 2, 5], [0, 2, 20],
                                           ["exponential", "lognormal"]))
def test_staleness_and_kept_versions_stay_within_their_bounds(concurrency, buffer_size,
                                                             max_staleness, kind):
  timeline = Timeline(IDS, concurrency, buffer_size, max_staleness,
                      {"kind": kind, "jitter": 0.3}, seed=concurrency + buffer_size)
  for n in range(1, 30):
    step = timeline.step(n)
    assert len(step.tasks) == buffer_size
    assert all(0 <= tau <= max_staleness for tau in step.staleness())
    live = timeline.live_versions(n)
    assert n in live and len(live) <= timeline.capacity
    later = {t.version for s in range(n + 1, n + max_staleness + 3)
             for t in timeline.step(s).tasks if t.version <= n}
    assert later <= live  # every version a later update trains from is kept
  for step in timeline.steps:  # an update waits in the buffer; the last one fills it
    assert all(t.start < t.arrival <= step.time for t in step.tasks)
    assert step.tasks[-1].arrival == step.time


def test_no_client_trains_twice_at_once():
  timeline = Timeline(IDS, 12, 3, 50, {"kind": "exponential"}, seed=3)
  tasks = sorted((t for n in range(1, 40) for t in timeline.step(n).tasks),
                 key=lambda t: t.index)
  for a, b in itertools.combinations(tasks, 2):
    if a.client == b.client:
      assert a.arrival <= b.start or b.arrival <= a.start


def test_lognormal_and_exponential_speeds_have_mean_one():
  for kind in ("lognormal", "exponential"):
    speeds = asynchrony.client_speeds(200_000, 0, kind)
    assert abs(speeds.mean() - 1.0) < 0.02
  assert np.all(asynchrony.client_speeds(5, 0, "constant") == 1.0)
  wide, narrow = (asynchrony.client_speeds(1000, 0, "lognormal", sigma=s) for s in (2.0, 0.5))
  assert wide.std() > 3 * narrow.std()


def test_staleness_weights_by_hand():
  assert staleness_weight(7) == 1.0
  assert staleness_weight(3, "polynomial", a=0.5) == 0.5  # (1 + 3)^-0.5
  assert staleness_weight(0, "polynomial", a=2.0) == 1.0
  assert staleness_weight(4, "hinge", a=10.0, b=4) == 1.0
  assert staleness_weight(5, "hinge", a=10.0, b=4) == pytest.approx(1 / 11)
  assert staleness_weight(6, "hinge", a=0.5, b=4) == 0.5  # 1 / (0.5 * 2 + 1)
  with pytest.raises(ValueError, match="staleness kind"):
    staleness_weight(1, "linear")


def test_bad_arguments_name_themselves():
  with pytest.raises(ValueError, match="concurrency"):
    Timeline(IDS, 13, 1, 0, CONSTANT, 0)
  with pytest.raises(ValueError, match="buffer_size"):
    Timeline(IDS, 2, 0, 0, CONSTANT, 0)
  with pytest.raises(ValueError, match="durations kind"):
    Timeline(IDS, 2, 1, 0, {"kind": "weibull"}, 0)
