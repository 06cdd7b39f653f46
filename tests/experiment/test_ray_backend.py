"""The ray backend: one experiment's clients on Ray actors.

Parity with the in-process backend (the CNN on actors of two threads, and a
two-node loopback cluster), exact resume, an actor killed mid-round, nothing
listening beyond loopback and nothing left running (after the command, and
after its driver is killed), and the config fields' validation.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.helpers import ROOT, saved_weights, tiny, tiny_base
from tests import process_table as processes
from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.data.sampling import sample_clients
from tff_fedadamom.metric_names import LOSS
from tff_fedadamom import runtime as backends
from tff_fedadamom.experiment import run_experiment
from tff_fedadamom.experiment import parts as parts_lib
from tff_fedadamom.runtime import inprocess
from tff_fedadamom.runtime import ray as ray_backend
from tff_fedadamom.experiment.process import load_data, make_client_tensors
from tff_fedadamom.runtime.ray_session import ray_session

# Two threads per actor, as this 2-core machine's in-process runs have: the
# thread count changes how TensorFlow's kernels split their reductions.
RAY = {"backend": "ray", "workers": 2, "cpus_per_worker": 1, "threads": 2}


def _assert_close(expected, actual, rtol=1e-5):
  """Relative error per weight tensor: max |a - e| <= rtol * max |e|."""
  assert len(expected) == len(actual)
  for e, a in zip(expected, actual):
    e, a = np.asarray(e), np.asarray(a)
    assert e.shape == a.shape
    assert np.max(np.abs(a - e)) <= rtol * max(np.max(np.abs(e)), 1e-30), (
        np.max(np.abs(a - e)), np.max(np.abs(e)))


def _ray_processes_of(pid):
  """Descendants of `pid` that are Ray's (GCS, raylet, workers)."""
  found = [child for child in processes.descendants(pid)
           if b"ray" in (processes.cmdline(child) or b"")]
  return processes.still_running(found)


# ------------------------------------------------------------------ assignment


def test_assignment_is_contiguous_blocks_in_order():
  assert ray_backend.assign_clients(list("abcdefg"), 3) == [list("abc"), list("de"), list("fg")]
  assert ray_backend.assign_clients(["a"], 2) == [["a"], []]
  ids = [f"c{i}" for i in range(10)]
  blocks = ray_backend.assign_clients(ids, 4)
  assert sum(blocks, []) == ids and [len(b) for b in blocks] == [3, 3, 2, 2]
  with pytest.raises(ValueError, match="actors"):
    ray_backend.assign_clients(ids, 0)


# ------------------------------------------------------------------ processes and ports

# Runs an experiment on the ray backend in a fresh interpreter. After round 1 it
# prints its processes and every TCP socket they listen on; after round `pause`
# it waits to be killed. Its temporary files (the sources AutoGraph writes, which
# a killed process never removes) go to the folder it is given: the test's.
_CHILD = textwrap.dedent("""
    import json, os, sys, tempfile, time
    tempfile.tempdir = sys.argv[3]  # Python's temporary files: Ray reads $TMPDIR instead
    from tests import process_table as processes
    from tff_fedadamom.experiment import run_experiment
    from tff_fedadamom.session import Session
    Session().apply()  # the driver is its process's entry point

    raw, pause = json.loads(sys.argv[1]), int(sys.argv[2])

    def on_round(round_num, metrics):
      if round_num == 1:
        pids = [os.getpid(), *processes.descendants(os.getpid())]
        print(json.dumps({"pids": pids, "listening": processes.tcp_listeners(pids)}),
              flush=True)
      if round_num == pause:
        print(json.dumps({"paused": True}), flush=True)
        time.sleep(600)

    run_experiment(raw, progress=False, on_round=on_round)
""")


def _start_child(raw, pause, scratch):
  return subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(raw), str(pause),
                           str(scratch)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT})


def _end(child, signum):
  """Sends `signum` to `child` and reaps it (SIGKILL if it is still there after a minute)."""
  child.send_signal(signum)
  try:
    child.wait(timeout=60)
  finally:
    if child.poll() is None:
      child.kill()
      child.wait()


def _wait_gone(pids, timeout_s=30.0):
  deadline = time.monotonic() + timeout_s
  while processes.still_running(pids) and time.monotonic() < deadline:
    time.sleep(0.5)
  return processes.still_running(pids)


@pytest.fixture(scope="module")
def killed_driver(tmp_path_factory):
  """A ray-backend run in a child driver, SIGKILLed in round 2: its first
  report (processes and listeners after round 1) and when it was killed."""
  root = tmp_path_factory.mktemp("killed")
  raw = tiny(root / "run", rounds=3, runtime=RAY)
  child = _start_child(raw, pause=2, scratch=root)
  try:
    first = json.loads(child.stdout.readline())
    paused = json.loads(child.stdout.readline())
  finally:
    _end(child, signal.SIGKILL)
  return first, paused, time.monotonic()


def test_a_local_run_listens_on_loopback_only(killed_driver):
  first, paused, _ = killed_driver
  assert len(first["pids"]) > 3  # the driver, Ray's services and its 2 actors
  assert first["listening"], "Ray's services listen on TCP"
  assert {address for _, address in first["listening"]} <= processes.LOOPBACK, \
      first["listening"]
  assert paused == {"paused": True}


# ------------------------------------------------------------------ parity


def test_cnn_with_dropout_equals_inprocess_with_two_actors_of_two_threads(tmp_path):
  """The quickstart's model (the CNN, with its dropout) on a run that starts its
  own local Ray: 2 actors of 2 threads give the in-process run's weights and
  test loss bit for bit, and the Ray the run started is gone with it.
  (test_ray_parity checks the other models the same way at one thread, on a
  Ray its module started.)"""
  import ray

  raw = tiny(tmp_path, model={"name": "cnn"}, data={"name": "mnist5k", "num_clients": 20},
             client__max_examples=32, rounds=2, eval_every=2, checkpoint_every=2)
  local_run = run_experiment({**raw, "output_dir": str(tmp_path / "inprocess")},
                             progress=False)
  result = run_experiment({**raw, "output_dir": str(tmp_path / "ray"), "runtime": RAY},
                          progress=False)
  assert result.summary["backend"] == "ray"
  assert result.summary["devices"] == ["ray actor 0 (CPU)", "ray actor 1 (CPU)"]
  assert result.summary["final_test_loss"] == local_run.summary["final_test_loss"]
  expected, actual = saved_weights(tmp_path / "inprocess"), saved_weights(tmp_path / "ray")
  assert len(expected) == len(actual) > 0
  for e, a in zip(expected, actual):
    np.testing.assert_array_equal(a, e)
  # The local Ray the run started is gone with it.
  assert not ray.is_initialized()
  deadline = time.monotonic() + 20
  while _ray_processes_of(os.getpid()) and time.monotonic() < deadline:
    time.sleep(0.5)
  assert not _ray_processes_of(os.getpid())


def _rounds(backend, config, data, rounds):
  """`rounds` rounds of the runner's sampling; the final trainable weights."""
  state = backend.initialize()
  ids = list(data.train.client_ids)
  for round_num in range(1, rounds + 1):
    sampled = sample_clients(ids, config.clients_per_round, config.seed, round_num)
    state = backend.next_for_clients(state, sampled, round_num).state
  return [np.asarray(w) for w in backend.get_model_weights(state).trainable]


def test_two_node_cluster_matches_inprocess(tmp_path, two_node_cluster):
  import ray

  # 4 clients over 2 actors: the partial sums are (u1 + u2) + (u3 + u4).
  config = load_config(tiny(tmp_path, clients_per_round=4, runtime={
      **RAY, "address": two_node_cluster}))
  data = load_data(config)
  process = parts_lib.learning_process(config, data)  # from the session's process cache
  local = inprocess.InProcessLearningProcess(
      process, client_tensors=make_client_tensors(config, data))
  expected = _rounds(local, config, data, 3)
  local.close()
  remote = backends.build_backend(parts_lib.make_plan(config), process)
  try:
    nodes = ray.get([a.node.remote() for a in remote.actors])
    assert len(set(nodes)) == 2, nodes
    actual = _rounds(remote, config, data, 3)
  finally:
    remote.close()
  assert not ray.is_initialized()  # disconnected; the cluster itself stays up
  _assert_close(expected, actual)


class RevalidationRefusingActor(ray_backend.ClientActor):
  """An actor that checks it was handed a validated config and refuses, in its
  own process, any validation of it."""

  def __init__(self, experiment, *args, **kwargs):
    from tff_fedadamom.config import loader

    def refuse(*args):
      raise AssertionError("the config was validated again in an actor")

    loader.check_registries = refuse  # this actor's process only
    assert loader.is_validated(experiment), type(experiment)
    super().__init__(experiment, *args, **kwargs)


# ------------------------------------------------------------------ failure


def _claims_the_arm(point: str) -> bool:
  """Whether this actor removed the file at $RAY_TEST_ARM, which names `point`
  (only one actor can remove it)."""
  try:
    with open(os.environ.get("RAY_TEST_ARM")) as f:
      if f.read() != point:
        return False
    os.remove(os.environ.get("RAY_TEST_ARM"))
  except (OSError, TypeError):
    return False
  return True


class DyingActor(ray_backend.ClientActor):
  """Ends its own process once per file at the arm: after its clients' work
  when the file says 'work', when asked to fold when it says 'fold'."""

  def work(self, *args, **kwargs):
    result = super().work(*args, **kwargs)
    if _claims_the_arm("work"):
      os._exit(1)
    return result

  def fold(self, accumulator):
    if _claims_the_arm("fold"):
      os._exit(1)
    return super().fold(accumulator)


class CheckedActor(RevalidationRefusingActor, DyingActor):
  """Refuses to validate its config again, and dies where the arm says."""


class TestOnOneLocalRay:
  """Runs whose subject is not their Ray session share one local Ray, started
  by the class (each run's actors are still its own, ended with it). A run
  that starts its own Ray, and ends it, is checked above."""

  @pytest.fixture(scope="class")
  def local_ray(self, tmp_path_factory):
    arm = str(tmp_path_factory.mktemp("arm") / "arm")
    with pytest.MonkeyPatch.context() as patch:
      patch.setenv("RAY_TEST_ARM", arm)  # before Ray starts: its actors inherit it
      with ray_session(None) as ray:
        yield ray

  @pytest.fixture(scope="class")
  def checked_actors(self, tmp_path_factory, local_ray):
    """One process on two `CheckedActor`s, 4 clients a round, for the tests of
    what the actors are handed and of actors dying: (config, data, process)."""
    config = load_config(tiny(tmp_path_factory.mktemp("checked"), clients_per_round=4,
                              runtime=RAY))
    data = load_data(config)
    remote = ray_backend.RayLearningProcess(parts_lib.learning_process(config, data), config,
                                            actors=2, actor_class=CheckedActor)
    yield config, data, remote
    remote.close()
    assert local_ray.is_initialized()  # the class's, left up

  def test_resume_on_the_ray_backend_is_exact(self, tmp_path, local_ray):
    """The three runs share one set of parts (the same 2 actors): a run with
    shared parts equals one with its own (tests/experiment/test_parts.py)."""

    def run(name, rounds):
      raw = tiny(tmp_path / name, rounds=rounds, runtime=RAY)
      return run_experiment(raw, progress=False, parts=parts)

    parts = parts_lib.build_parts(load_config(tiny(tmp_path, runtime=RAY)))
    try:
      run("resumed", 2)
      resumed = run("resumed", 3)
      assert resumed.summary["resumed_from_round"] == 2
      run("straight", 3)
    finally:
      parts.process.close()
    assert local_ray.is_initialized()  # the class's, left up
    for a, b in zip(saved_weights(tmp_path / "straight"), saved_weights(tmp_path / "resumed"),
                    strict=True):
      np.testing.assert_array_equal(a, b)

  def test_actors_receive_the_validated_config_and_do_not_validate_it_again(self,
                                                                             checked_actors):
    """The driver validates once; its actors get that config (pickled, it keeps
    its validated mark), not a mapping each would validate again: an actor
    that validated it would have failed to start or to work."""
    config, data, remote = checked_actors
    sampled = sample_clients(list(data.train.client_ids), 4, config.seed, 1)
    output = remote.next_for_clients(remote.initialize(), sampled, 1)
    assert np.isfinite(output.metrics["client_work"]["train"][LOSS])

  def test_an_actor_dying_in_work_or_in_the_fold_is_replaced_with_the_same_result(
      self, local_ray, checked_actors):
    """Round 1 undisturbed, then again with an actor dying after its work, then
    with one dying in the fold: each time one actor process is replaced, in place,
    and the weights and metrics are those of the undisturbed round."""
    ray, arm = local_ray, os.environ["RAY_TEST_ARM"]  # the actors inherit it
    config, data, remote = checked_actors
    # No GPU: each actor runs its block's clients interleaved on its one thread.
    assert remote.max_concurrent_clients is None and remote._threads == 1  # noqa: SLF001
    state = remote.initialize()
    sampled = sample_clients(list(data.train.client_ids), 4, config.seed, 1)
    undisturbed = remote.next_for_clients(state, sampled, 1)
    before = remote.replacements
    for replacements, point in enumerate(("work", "fold"), start=1):
      pids = ray.get([a.pid.remote() for a in remote.actors])
      with open(arm, "w") as f:
        f.write(point)
      disturbed = remote.next_for_clients(state, sampled, 1)
      assert not os.path.exists(arm) and remote.replacements == before + replacements, point
      for a, b in zip(remote.get_model_weights(undisturbed.state).trainable,
                      remote.get_model_weights(disturbed.state).trainable, strict=True):
        np.testing.assert_array_equal(a, b)
      assert undisturbed.metrics == disturbed.metrics, point
      after = ray.get([a.pid.remote() for a in remote.actors])
      assert len(set(after) - set(pids)) == 1, point  # one new actor process, in place
    remote.next_for_clients(disturbed.state, sampled, 2)  # the new actors work on


# ------------------------------------------------------------------ busy actors


class SlowActor(ray_backend.ClientActor):
  """An actor whose `work` is one TensorFlow call that never returns (a dequeue
  from an empty queue: blocked, not spinning, so the test's other processes keep
  the CPUs): the interpreter does not run again, nor handle a signal. Before
  the call it leaves a file named by its pid in $BUSY_ACTORS_DIR."""

  def work(self, *args, **kwargs):
    import tensorflow as tf

    open(os.path.join(os.environ["BUSY_ACTORS_DIR"], str(os.getpid())), "w").close()
    tf.queue.FIFOQueue(1, tf.float32).dequeue()
    return super().work(*args, **kwargs)


# Starts a ray-backend round whose actors are busy in `work`; prints their pids.
_BUSY_CHILD = textwrap.dedent("""
    import json, sys, tempfile
    tempfile.tempdir = sys.argv[2]  # as _CHILD's
    import ray
    from tests.experiment.test_ray_backend import SlowActor
    from tff_fedadamom.config import load_config
    from tff_fedadamom.runtime import ray as ray_backend
    from tff_fedadamom.experiment.parts import learning_process
    from tff_fedadamom.experiment.process import load_data

    config = load_config(json.loads(sys.argv[1]))
    data = load_data(config)
    remote = ray_backend.RayLearningProcess(learning_process(config, data), config, actors=2,
                                            actor_class=SlowActor)
    print(json.dumps(ray.get([a.pid.remote() for a in remote.actors])), flush=True)
    remote.next_for_clients(remote.initialize(), list(data.train.client_ids)[:2], 1)
""")


def test_actors_busy_in_a_round_end_with_their_killed_driver(tmp_path):
  """An unhandled SIGTERM ends the driver (as `kill` or `timeout` would) while
  its actors are inside `work`: they end within seconds."""
  busy = tmp_path / "busy"
  busy.mkdir()
  child = subprocess.Popen(
      [sys.executable, "-c", _BUSY_CHILD, json.dumps(tiny(tmp_path / "run", runtime=RAY)),
       str(tmp_path)],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
      env={**os.environ, "PYTHONPATH": ROOT, "BUSY_ACTORS_DIR": str(busy)})
  try:
    actors = json.loads(child.stdout.readline())
    deadline = time.monotonic() + 60
    while len(os.listdir(busy)) < len(actors) and time.monotonic() < deadline:
      time.sleep(0.1)
    # Both actors have reached their `work`'s TensorFlow call.
    assert sorted(int(name) for name in os.listdir(busy)) == sorted(actors)
    time.sleep(0.2)
    assert sorted(processes.still_running(actors)) == sorted(actors)
  finally:
    _end(child, signal.SIGTERM)
  started = time.monotonic()
  left = _wait_gone(actors, timeout_s=30)
  assert not left, f"actors still running {time.monotonic() - started:.0f} s after the kill"


# ------------------------------------------------------------------ config


@pytest.mark.parametrize("runtime_section,field,wording", [
    ({"backend": "rey"}, "runtime.backend", "'tff_cpp' or 'ray'"),
    ({**RAY, "workers": 0}, "runtime.workers", "an integer >= 1"),
    ({**RAY, "workers": "two"}, "runtime.workers", "an integer"),
    ({**RAY, "workers": 1.5}, "runtime.workers", "an integer"),
    ({**RAY, "cpus_per_worker": 0}, "runtime.cpus_per_worker", "a number > 0"),
    ({**RAY, "cpus_per_worker": 1.5}, "runtime.cpus_per_worker", "whole CPUs"),
    ({**RAY, "cpus_per_worker": "1"}, "runtime.cpus_per_worker", "a number"),
    ({**RAY, "gpus_per_worker": -0.5}, "runtime.gpus_per_worker", "a fraction of one GPU"),
    ({**RAY, "gpus_per_worker": 2.5}, "runtime.gpus_per_worker", "whole GPUs"),
    ({**RAY, "address": "my cluster"}, "runtime.address", "host:port"),
    ({**RAY, "address": 6379}, "runtime.address", "a string"),
    ({**RAY, "devices": ["CPU:0"]}, "runtime.devices", "backend 'ray'"),
    ({"workers": 2}, "runtime.workers", "backend 'ray'"),
    ({"backend": "inprocess", "cpus_per_worker": 1}, "runtime.cpus_per_worker", "'ray'"),
    ({"backend": "tff_cpp", "gpus_per_worker": 0.5}, "runtime.gpus_per_worker", "'ray'"),
    ({"address": "auto"}, "runtime.address", "backend 'ray'"),
])
def test_ray_fields_are_validated(tmp_path, runtime_section, field, wording):
  with pytest.raises(ConfigError) as raised:
    load_config(tiny(tmp_path, runtime=runtime_section))
  assert raised.value.field == field
  assert wording in str(raised.value)


@pytest.mark.parametrize("runtime_section", [
    {"backend": "ray"},
    {**RAY, "gpus_per_worker": 0.25, "address": "auto"},
    {**RAY, "cpus_per_worker": 0.5, "address": "10.0.0.5:6379", "threads": 1},
    {**RAY, "workers": 8, "cpus_per_worker": 2, "gpus_per_worker": 1,
     "address": "ray://head:10001"},
])
def test_valid_ray_settings_load(tmp_path, runtime_section):
  plan = parts_lib.make_plan(tiny(tmp_path, runtime=runtime_section))
  assert plan.backend == "ray" and plan.threads is None  # threads size the actors
  settings = plan.ray
  assert settings == ray_backend.ray_actors(plan.config.runtime)
  assert settings["actors"] == runtime_section.get("workers", 2)
  assert settings["cpus_per_actor"] == runtime_section.get("cpus_per_worker", 1)
  assert len(plan.devices) == settings["actors"]


def test_sweeps_reject_the_ray_backend_in_trials(tmp_path):
  from tuning.schema import SweepConfigError, parse_sweep

  with pytest.raises(SweepConfigError) as raised:
    parse_sweep({"base": tiny_base(runtime={"backend": "ray"}), "optimizers": ["fedavg"],
                 "budget": {"trials_per_optimizer": 1, "rounds": 1}})
  assert raised.value.field == "base.runtime.backend"
  assert "not run inside sweep trials yet" in str(raised.value)


# ------------------------------------------------------------------ after the kill


def test_nothing_left_when_the_driver_is_killed(killed_driver):
  """SIGKILL of the driver in the middle of a run ends every process it started
  (Ray's agents and the session's reaper included) within 30 s of the kill;
  without the reaper, Ray's agents took 62 s."""
  first, _, killed_at = killed_driver
  left = _wait_gone(first["pids"], timeout_s=max(0.0, killed_at + 30 - time.monotonic()))
  assert not left, f"still running {time.monotonic() - killed_at:.0f} s after the kill: {left}"
