"""Asynchronous runs (`runtime.buffered`): the synchronous special case bit for bit,
exact resume with clients in flight, FADAS' delay-adaptive rate where the
staleness exceeds its threshold, staleness weights on the update alone, the same
bits on the ray backend, and the config's refusals."""

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import metrics_rows, saved_weights, tiny
from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.experiment import run_experiment
from tff_fedadamom.metric_names import ASYNC_PREFIX, MAX_STALENESS
from tff_fedadamom.runtime.inprocess import scale_update
from tff_fedadamom.runtime.ray_session import ray_session

# Five clients at once, a server step every three arrivals, per-client speeds
# spread wide, and polynomial staleness weights: stale updates in every step.
ASYNC = {"concurrency": 5, "buffer_size": 3, "max_staleness": 4,
         "durations": {"kind": "lognormal", "sigma": 1.0, "jitter": 0.2},
         "staleness": {"kind": "polynomial", "a": 0.5}}


def _run(tmp_path, name, asynchronous=None, **overrides):
  raw = tiny(tmp_path / name, **overrides)
  if asynchronous is not None:
    raw["asynchronous"] = asynchronous
  return run_experiment(raw, progress=False)


def _same_weights(a, b):
  wa, wb = saved_weights(a), saved_weights(b)
  return len(wa) == len(wb) > 0 and all(np.array_equal(x, y) for x, y in zip(wa, wb))


def _without_async(rows):
  return [{k: v for k, v in row.items() if not k.startswith(ASYNC_PREFIX)} for row in rows]


def test_no_delay_and_a_full_buffer_is_the_synchronous_run(tmp_path):
  _run(tmp_path, "sync")
  _run(tmp_path, "async", {"durations": {"kind": "constant"}})  # C = K = clients_per_round
  assert _same_weights(tmp_path / "sync", tmp_path / "async")
  rows = metrics_rows(tmp_path / "async")
  assert _without_async(rows) == metrics_rows(tmp_path / "sync")
  assert [float(r[MAX_STALENESS]) for r in rows] == [0.0] * 4
  assert [float(r[ASYNC_PREFIX + "virtual_time"]) for r in rows] == [1.0, 2.0, 3.0, 4.0]


def test_a_run_resumed_mid_way_equals_one_run_straight(tmp_path):
  _run(tmp_path, "straight", ASYNC, rounds=6)
  _run(tmp_path, "resumed", ASYNC, rounds=3)
  _run(tmp_path, "resumed", ASYNC, rounds=6)  # from round 3's checkpoint, clients in flight
  rows = metrics_rows(tmp_path / "straight")
  assert max(float(r[MAX_STALENESS]) for r in rows) >= 2  # the ring was in use
  assert _same_weights(tmp_path / "straight", tmp_path / "resumed")
  resumed = metrics_rows(tmp_path / "resumed")
  assert resumed[3:] == rows[3:]
  # Round 3 ended the first run, so it was evaluated there, and only there.
  assert [{k: v for k, v in r.items() if not k.startswith("test/")} for r in resumed[:3]] == [
      {k: v for k, v in r.items() if not k.startswith("test/")} for r in rows[:3]]


def test_fadas_slows_down_exactly_at_the_steps_staler_than_its_threshold(tmp_path):
  # Three clients at once, one update per step, equal durations: the three
  # that start together arrive together, so the steps' staleness runs 0, 1, 2,
  # 0, 1, 2 (hand-computed in tests/test_asynchrony.py's manner). With tau_c = 1
  # step 3 takes eta / 2; with tau_c = 5 it takes eta. Steps 1 and 2 agree.
  timeline = {"concurrency": 3, "buffer_size": 1, "durations": {"kind": "constant"}}
  server = {"optimizer": "fadas", "learning_rate": 0.01}
  for name, tau_c in (("adaptive", 1.0), ("plain", 5.0)):
    for rounds in (2, 3):
      _run(tmp_path, f"{name}{rounds}", timeline, rounds=rounds, eval_every=1,
           server={**server, "delay_threshold": tau_c})
  rows = metrics_rows(tmp_path / "adaptive3")
  assert [float(r[MAX_STALENESS]) for r in rows] == [0.0, 1.0, 2.0]
  assert _same_weights(tmp_path / "adaptive2", tmp_path / "plain2")
  assert not _same_weights(tmp_path / "adaptive3", tmp_path / "plain3")


def test_a_staleness_weight_scales_the_update_and_nothing_else():
  output = [tf.constant([2.0, 3.0]), tf.constant([[1.0, -2.0]]), tf.constant([4.0]),
            tf.constant(1.0)]
  scaled = scale_update(output, 0.25, slice(1, 3))
  np.testing.assert_array_equal(scaled[1], [[0.25, -0.5]])
  np.testing.assert_array_equal(scaled[2], [1.0])
  assert scaled[0] is output[0] and scaled[3] is output[3]
  assert all(a is b for a, b in zip(scale_update(output, 1.0, slice(1, 3)), output))


def test_the_ray_backend_gives_the_same_bits(tmp_path):
  with ray_session(None):
    ray = _run(tmp_path, "ray", ASYNC, runtime={"backend": "ray", "workers": 2,
                                                "cpus_per_worker": 1, "threads": 1})
  assert ray.summary["backend"] == "ray" and len(ray.summary["devices"]) == 2
  _run(tmp_path, "inprocess", ASYNC)
  assert _same_weights(tmp_path / "ray", tmp_path / "inprocess")
  assert metrics_rows(tmp_path / "ray") == metrics_rows(tmp_path / "inprocess")


@pytest.mark.parametrize("change,field", [
    ({"server": {"optimizer": "fafed"}}, "asynchronous"),
    ({"runtime": {"backend": "tff_cpp"}}, "runtime.backend"),
    ({"asynchronous": {"concurrency": 9}}, "asynchronous.concurrency"),
    ({"asynchronous": {"durations": {"kind": "weibull"}}}, "asynchronous.durations.kind"),
    ({"asynchronous": {"staleness": {"kind": "hinge", "b": 1.5}}}, "asynchronous.staleness.b"),
    ({"asynchronous": {"staleness": {"kind": "polynomial", "a": 0}}},
     "asynchronous.staleness.a"),
    ({"asynchronous": {"max_staleness": -1}}, "asynchronous.max_staleness"),
])
def test_bad_asynchronous_configs_name_the_field(tmp_path, change, field):
  raw = tiny(tmp_path)
  raw["asynchronous"] = {}
  for section, values in change.items():
    raw[section] = values if section == "server" else {**raw.get(section, {}), **values}
  with pytest.raises(ConfigError) as error:
    load_config(raw)
  assert error.value.field == field
