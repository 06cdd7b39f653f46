"""Trials in long-lived workers (tuning.workers): a trial's results do not depend
on what ran before it in its worker, a worker that dies loses only its trial, and
a shared pool's workers serve one sweep after another.

The module's sweeps share one local Ray and one pool (`shared_pool`): each
test's subject holds within a sweep, whatever ran in the workers before it."""

import os
import signal
import types

import pytest
from ray import tune

from tests.tuning.conftest import rounds_reported_again, tiny_base, write_sweep
from tff_fedadamom.metric_names import TEST_ACCURACY, TEST_LOSS, TRAIN_ACCURACY, TRAIN_LOSS
from tuning import run_sweep
from tuning.joint import split
from tuning.pools import SharedWorkerPool
from tuning.workers import process_identity, worker_env

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


def test_a_trial_after_two_others_in_its_worker_equals_it_first(tmp_path, shared_pool,
                                                                no_leftover_workers):
  """One worker (one trial at a time) runs client rates 0.05, 0.5, 0.2, then
  0.05 again: the last trial reports what the first did, round for round."""
  result = run_sweep(_sweep(tmp_path, "order", [0.05, 0.5, 0.2, 0.05],
                            max_concurrent_trials=1), progress_interval_s=600,
                     pool=shared_pool)
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


def test_a_worker_that_dies_loses_only_its_trial(tmp_path, shared_pool, no_leftover_workers):
  marker = str(tmp_path / "killed")
  result = run_sweep(_sweep(tmp_path, "kill", [0.05, 0.2], max_concurrent_trials=2,
                            max_failures=1),
                     progress_interval_s=600, callbacks=[KillWorkerOnce(marker)],
                     pool=shared_pool)
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
  from tff_fedadamom.experiment.plan import threads_for_cpus
  from tuning.trainable import trial_threads

  given = types.SimpleNamespace(required_resources={"CPU": cpus})
  monkeypatch.setattr(tune, "get_context",
                      lambda: types.SimpleNamespace(get_trial_resources=lambda: given))
  assert trial_threads() == threads_for_cpus(cpus) == threads


def test_process_identity_tells_ended_processes():
  assert process_identity(os.getpid())[0] == os.getpid()
  assert process_identity(2 ** 22 + 12345) is None


def test_a_later_sweep_runs_in_the_warm_workers_of_a_shared_pool(tmp_path, shared_pool):
  """The pool outlives a sweep: the next sweep's trial runs in the worker the
  first one's ran in (still alive in between), and reports the same rounds."""
  runs = []
  for name in ("first", "second"):
    result = run_sweep(_sweep(tmp_path, name, [0.05], max_concurrent_trials=1),
                       progress_interval_s=600, export=False, pool=shared_pool)
    (trial,) = result.results["fedadamom"]
    assert not trial.error
    assert process_identity(int(trial.metrics["worker_pid"])) is not None  # kept
    runs.append(trial)
  first, second = runs
  assert second.metrics["worker_pid"] == first.metrics["worker_pid"]
  assert second.metrics["pid"] != second.metrics["worker_pid"]
  frames = [t.metrics_dataframe[METRICS].reset_index(drop=True) for t in runs]
  assert list(frames[0]["round"]) == [1, 2, 3]
  assert frames[0].equals(frames[1])


def test_run_sweep_refuses_a_pool_it_cannot_use_before_writing_anything(tmp_path, shared_pool):
  path = _sweep(tmp_path, "refused", [0.05])
  refusals = [
      (dict(pool=shared_pool, reuse_workers=False), "reuse_workers=False"),
      (dict(pool=SharedWorkerPool("trial-pool-shared-ended")),
       "'trial-pool-shared-ended' is not running in this process's Ray session"),
      (dict(pool="trial-pool-shared-ended"), "must be a tuning.pools.SharedWorkerPool"),
  ]
  for kwargs, wording in refusals:
    with pytest.raises(ValueError, match=wording):
      run_sweep(path, **kwargs)
  assert not os.path.exists(tmp_path / "sweeps")


# The threads that unpickled a `_MakeExperiment` (`TrialWorker.start`'s bytes).
_UNPICKLED_IN: list = []


def _unpickle_make_experiment():
  import threading

  _UNPICKLED_IN.append(threading.current_thread().name)
  return _MakeExperiment()


class _MakeExperiment:
  """A trial's `make_experiment` that records which thread unpickled it, and fails."""

  def __reduce__(self):
    return _unpickle_make_experiment, ()

  def __call__(self):
    raise RuntimeError("no experiment here")


def test_a_trials_callables_are_unpickled_in_the_trial_thread(tmp_path):
  """`start` takes the trial's callables pickled, and the worker's trial thread
  loads them, after its start-up imports: unpickled in Ray's thread, they once
  imported the project's modules while the trial thread did, and a restarted
  trial failed on a partially initialized module. The worker runs in this
  process here (no Ray), so the thread names are this process's."""
  from ray import cloudpickle

  from tuning.workers import TrialWorker

  worker = TrialWorker()
  assert worker.claim("t", process_identity(os.getpid()))
  worker.start("t", cloudpickle.dumps((_MakeExperiment(), None, None)), str(tmp_path))
  kind, payload = worker.next_event("t")
  worker.release("t")
  assert kind == "error" and "no experiment here" in payload
  assert _UNPICKLED_IN == ["tff-trials"]


def test_a_released_trial_waiting_at_an_evaluation_ends_at_once(monkeypatch):
  """Tune ends a trial at its last report and the trainable releases it without
  asking for another event: the run, waiting at that evaluation, must give up
  then, not at its next poll (the next trial's claim of the worker waits for
  it). With a poll of a minute, only the release can wake it within the join."""
  import threading

  from tuning import workers

  monkeypatch.setattr(workers, "_POLL_S", 60.0)
  trial = workers._Trial("t", process_identity(os.getpid()))
  outcome = []

  def run():
    try:
      trial.hand_over("last evaluation")
      outcome.append("went on")
    except workers._Abandoned:
      outcome.append("gave up")

  waiting = threading.Thread(target=run)
  waiting.start()
  assert trial.events.get(timeout=10) == ("eval", "last evaluation")
  trial.give_up()
  waiting.join(timeout=10)
  assert not waiting.is_alive() and outcome == ["gave up"]

  # An evaluation the trainable asks past goes on as before.
  trial = workers._Trial("u", process_identity(os.getpid()))
  trial.ack.release()
  trial.hand_over("an evaluation")
  assert trial.events.get_nowait() == ("eval", "an evaluation")
