"""Trials in long-lived workers (tuning.workers): a trial's results do not depend
on what ran before it in its worker, and a worker that dies loses only its trial."""

import os
import signal
import types

import pytest
from ray import tune

from tests.tuning.conftest import rounds_reported_again, tiny_base, write_sweep
from tff_fedadamom.metric_names import TEST_ACCURACY, TEST_LOSS, TRAIN_ACCURACY, TRAIN_LOSS
from tuning import run_sweep
from tuning.joint import split
from tuning.workers import NAMESPACE, WorkerPool, process_identity, worker_env

METRICS = ["round", TRAIN_LOSS, TRAIN_ACCURACY, TEST_LOSS, TEST_ACCURACY, "objective"]


def _sweep(tmp_path, name, rates, **resources):
  return write_sweep(tmp_path, {
      "name": name,
      "base": tiny_base(),
      "optimizers": ["fedadamom"],
      "budget": {"trials_per_optimizer": len(rates), "rounds": 3},
      "space": {"client.learning_rate": {"dist": "grid", "values": rates},
                "server.epsilon": None, "server.beta_2": None,
                "server.learning_rate": None},
      "search": {"kind": "grid"},
      "metric": {"name": TEST_ACCURACY, "last_k": 2},
      "resources": {"cpus_per_trial": 1, "storage_path": str(tmp_path / "sweeps"),
                    **resources},
  }, name=f"{name}.yaml")


def _in_start_order(grid):
  return sorted(grid, key=lambda r: r.metrics_dataframe["timestamp"].iloc[0])


def test_a_trial_after_two_others_in_its_worker_equals_it_first(tmp_path,
                                                                no_leftover_workers):
  """One worker (one trial at a time) runs client rates 0.05, 0.5, 0.2, then
  0.05 again: the last trial reports what the first did, round for round."""
  result = run_sweep(_sweep(tmp_path, "order", [0.05, 0.5, 0.2, 0.05],
                            max_concurrent_trials=1), progress_interval_s=600)
  trials = _in_start_order(result.results["fedadamom"])
  assert [split(t.config)[1]["client.learning_rate"] for t in trials] == [0.05, 0.5, 0.2, 0.05]
  assert not any(t.error for t in trials)
  assert len({t.metrics["worker_pid"] for t in trials}) == 1  # one worker ran them all
  assert all(t.metrics["pid"] != t.metrics["worker_pid"] for t in trials)
  first, last = (t.metrics_dataframe[METRICS].reset_index(drop=True)
                 for t in (trials[0], trials[-1]))
  assert list(first["round"]) == [1, 2, 3]
  assert first.equals(last)
  other = trials[1].metrics_dataframe[METRICS].reset_index(drop=True)
  assert not first.equals(other)  # a check that can fail


class KillWorkerOnce(tune.Callback):
  """SIGKILLs the worker running the first trial that reports round 1, once."""

  def __init__(self, marker: str):
    self.marker = marker

  def on_trial_result(self, iteration, trials, trial, result, **info):
    if result.get("round") == 1 and not os.path.exists(self.marker):
      with open(self.marker, "w") as f:
        f.write(f"{trial.trial_id} {result['worker_pid']}")
      os.kill(int(result["worker_pid"]), signal.SIGKILL)


def test_a_worker_that_dies_loses_only_its_trial(tmp_path, no_leftover_workers):
  marker = str(tmp_path / "killed")
  result = run_sweep(_sweep(tmp_path, "kill", [0.05, 0.2], max_concurrent_trials=2,
                            max_failures=1),
                     progress_interval_s=600, callbacks=[KillWorkerOnce(marker)])
  with open(marker) as f:
    killed_trial, killed_pid = f.read().split()
  grid = result.results["fedadamom"]
  assert len(grid) == 2 and grid.num_terminated == 2 and not grid.errors
  for trial in grid:
    frame = trial.metrics_dataframe
    assert list(frame["round"])[-1] == 3
    if trial.metrics["trial_id"] == killed_trial:
      assert list(frame["worker_pid"])[-1] != int(killed_pid)  # restarted elsewhere
      # It had no checkpoint yet (without ASHA only round 3 has one): it ran
      # round 1 again, with the same results.
      assert rounds_reported_again([trial]) >= 1
    else:
      assert int(killed_pid) not in set(frame["worker_pid"])
  assert process_identity(int(killed_pid)) is None


def test_worker_env_sizes_threads_and_shows_only_the_trials_gpus():
  env = worker_env(3, ["1"])
  # Kernels run single-threaded; the trial's CPUs run its clients side by side.
  assert env["TF_NUM_INTRAOP_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "1"
  assert env["TF_NUM_INTEROP_THREADS"] == "3" and env["CUDA_VISIBLE_DEVICES"] == "1"
  assert worker_env(1, [])["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("cpus, threads", [(0.5, 1), (1, 1), (2.0, 2), (2.5, 2), (4, 4)])
def test_a_trial_gets_the_threads_of_its_whole_cpus(monkeypatch, cpus, threads):
  """A trial's threads (from what Tune gives it) follow the one formula the pool
  sizes its pre-started workers by: whole CPUs, at least one."""
  from tff_fedadamom.pipeline.plan import threads_for_cpus
  from tuning.trainable import trial_threads

  given = types.SimpleNamespace(required_resources={"CPU": cpus})
  monkeypatch.setattr(tune, "get_context",
                      lambda: types.SimpleNamespace(get_trial_resources=lambda: given))
  assert trial_threads() == threads_for_cpus(cpus) == threads


def test_process_identity_tells_ended_processes():
  assert process_identity(os.getpid())[0] == os.getpid()
  assert process_identity(2 ** 22 + 12345) is None


def _in_actor(actor, fn, *args):
  """`fn(*args)` run in `actor`'s process (Ray's `__ray_call__` passes the
  actor's instance first)."""
  import ray

  return ray.get(actor.__ray_call__.remote(lambda _, *a: fn(*a), *args))


def test_a_worker_sees_the_gpus_of_its_trial_and_ray_leaves_them_alone(monkeypatch):
  """Ray blanks CUDA_VISIBLE_DEVICES of a zero-GPU actor unless told not to; a
  worker (zero GPUs of its own) must keep the GPU ids of the trial it serves.
  Ray is told of one GPU here; no GPU is needed (nothing runs on it)."""
  import ray

  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # tests/conftest.py hides GPUs

  ray.init(address="local", num_cpus=1, num_gpus=1, include_dashboard=False,
           _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
  try:
    pool = ray.remote(WorkerPool).options(namespace=NAMESPACE, num_cpus=0).remote()
    node = ray.get_runtime_context().get_node_id()
    owner = process_identity(os.getpid())
    gpu = ray.get(pool.acquire.remote(node, 1, ["0"], "a", owner))
    cpu = ray.get(pool.acquire.remote(node, 2, [], "b", owner))
    getenv = lambda name: os.environ.get(name)  # looked up in the actor
    assert _in_actor(gpu, getenv, "CUDA_VISIBLE_DEVICES") == "0"
    assert _in_actor(cpu, getenv, "CUDA_VISIBLE_DEVICES") == ""
    assert _in_actor(cpu, getenv, "TF_NUM_INTEROP_THREADS") == "2"
    assert _in_actor(cpu, getenv, "TF_NUM_INTRAOP_THREADS") == "1"
    # A busy worker is not handed out again: another trial of its key gets a new one.
    again = ray.get(pool.acquire.remote(node, 1, ["0"], "c", owner))
    assert _in_actor(again, os.getpid) != _in_actor(gpu, os.getpid)
    ray.get(pool.shutdown.remote())
  finally:
    ray.shutdown()
