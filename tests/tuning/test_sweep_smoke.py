"""A real sweep end to end on a local Ray: 2 optimizers x 2 trials x 3 rounds of
the CNN (with its two dropout layers) on digits with ASHA (one rung, at round
2), one trial per optimizer with a learning rate that diverges, and one trial
whose process is killed once Tune has its rung checkpoint (Tune restarts it from
there); then export, and re-running each exported config reproduces its trial
exactly.

A trial runs on its one CPU's thread; the exported config runs as a user would
run it, on every core of this machine. The CNN's convolutions and matmuls are
where a thread count could change float reduction order, so this is the sweep
that shows a trial's numbers do not depend on it."""

import csv
import json
import math
import os
import signal
import subprocess
import sys

import pytest
from ray import tune

from tests.helpers import tiny_base
from tests.tuning.conftest import our_worker_binaries, write_sweep
from tff_fedadamom.config import load_config
from tff_fedadamom.metric_names import TEST_ACCURACY, TEST_LOSS
from tuning import joint, progress, run_sweep
from tuning.sweep import SweepError
from tuning.trainable import objective_from_history

LAST_K = 2
CLI = os.path.join(os.path.dirname(sys.executable), "tff-fedadamom")


class CrashOnce(tune.Callback):
  """Kills the process of the fedavg trial with learning rate 1 once Tune has its
  round-2 checkpoint (ASHA's rung), once (a crash: FailureConfig restarts it
  from there). Every checkpoint Tune registers is logged to `marker`.log as
  'trial_id round' (Tune pickles callbacks: state is kept in files)."""

  def __init__(self, marker: str):
    self.marker = marker

  def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
    result = trial.last_result or {}
    with open(self.marker + ".log", "a") as f:
      f.write(f"{trial.trial_id} {result.get('round')}\n")
    optimizer, params = joint.split(trial.config)
    if (result.get("round") == 2 and params.get("server.learning_rate") == 1.0
        and optimizer == "fedavg" and not os.path.exists(self.marker)):
      with open(self.marker, "w") as f:
        f.write(f"{trial.trial_id} {result['pid']}")
      os.kill(int(result["pid"]), signal.SIGKILL)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  root = tmp_path_factory.mktemp("smoke")
  path = write_sweep(root, {
      "name": "smoke",
      "base": tiny_base(model={"name": "cnn"}),
      "optimizers": ["fedavg", "fedadamom"],
      "budget": {"trials_per_optimizer": 2, "rounds": 3},
      "space": {"client.learning_rate": None, "server.epsilon": None,
                "server.beta_2": None,
                # 1e38 overflows float32 within two rounds: a diverged trial.
                "server.learning_rate": {"dist": "grid", "values": [1.0, 1.0e+38]}},
      "search": {"kind": "grid"},
      # Rungs at round 2 only (2 * 2 > 3): trials checkpoint at rounds 2 and 3.
      "scheduler": {"kind": "asha", "grace_period": 2, "reduction_factor": 2},
      "metric": {"name": TEST_ACCURACY, "last_k": LAST_K},
      "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 2,
                    "storage_path": str(root / "sweeps")},
  })
  result = run_sweep(path, progress_interval_s=60,
                     callbacks=[CrashOnce(str(root / "crashed"))])
  with open(root / "crashed") as f:
    crashed_id, crashed_pid = f.read().split()
  yield path, result, (crashed_id, int(crashed_pid)), str(root / "crashed.log")
  import ray

  assert not ray.is_initialized()  # run_sweep shut down the Ray it started
  assert progress.LIVE == {}  # the sweep's live progress ended with the call


def test_sweep_runs_every_trial(smoke):
  _, result, _, _ = smoke
  assert not result.interrupted
  for optimizer in ("fedavg", "fedadamom"):
    grid = result.results[optimizer]
    assert len(grid) == 2 and grid.num_terminated == 2 and not grid.errors
    rounds = sorted(r.metrics["round"] for r in grid)
    assert rounds == [2, 3]  # the diverged trial stopped at round 2


def test_crashed_trial_restarts_from_its_checkpoint(smoke):
  _, result, (trial_id, pid), _ = smoke
  crashed = [r for r in result.results["fedavg"] if r.metrics["trial_id"] == trial_id]
  assert len(crashed) == 1 and crashed[0].error is None
  frame = crashed[0].metrics_dataframe
  assert list(frame["round"]) == [1, 2, 3]  # round 3 once, after the restart
  assert list(frame["pid"])[:2] == [pid, pid] and list(frame["pid"])[-1] != pid


def test_trials_checkpoint_at_the_rung_and_at_their_end_only(smoke):
  """Tune registers a trial's checkpoint at ASHA's rung (round 2) and at its
  last round (3), not at round 1; a diverged trial (it stops at round 2)
  checkpoints there. The crashed trial checkpoints at 2 before and 3 after."""
  _, result, (crashed_id, _), log = smoke
  with open(log) as f:
    logged = [line.split() for line in f.read().splitlines()]
  by_trial = {}
  for trial_id, round_num in logged:
    by_trial.setdefault(trial_id, []).append(int(round_num))
  trials = {r.metrics["trial_id"]: r for grid in result.results.values() for r in grid}
  assert set(by_trial) == set(trials)
  for trial_id, rounds in by_trial.items():
    last = int(trials[trial_id].metrics["round"])
    assert rounds == ([2, 3] if last == 3 else [2]), (trial_id, rounds)
  assert by_trial[crashed_id] == [2, 3]
  for trial_id in trials:  # what Tune keeps: the last one (num_to_keep=1)
    kept = [d for d in os.listdir(trials[trial_id].path) if d.startswith("checkpoint_")]
    assert len(kept) == 1, kept


def test_diverged_trial_is_never_best(smoke):
  _, result, _, _ = smoke
  for optimizer, best in result.export.best.items():
    assert best.trial.params == {"server.learning_rate": 1.0}, optimizer
    assert not best.trial.diverged and best.complete
  with open(os.path.join(result.sweep_dir, "trials.csv")) as f:
    trials = list(csv.DictReader(f))
  assert len(trials) == 4
  diverged = [t for t in trials if t["diverged"] == "1"]
  assert {float(t["hparam/server.learning_rate"]) for t in diverged} == {1e38}
  assert all(float(t["objective"]) <= -1e299 for t in diverged)
  assert all(t["node_id"] and t["hostname"] and t["pid"] for t in trials)
  with open(os.path.join(result.sweep_dir, "leaderboard.csv")) as f:
    board = {r["optimizer"]: r for r in csv.DictReader(f)}
  assert board["fedavg"]["trials_run"] == "2" and board["fedavg"]["trials_diverged"] == "1"


def test_exported_configs_reproduce_the_trials(smoke, tmp_path, no_leftover_workers):
  """`tff-fedadamom run best/<optimizer>.yaml` (in its own process, as a user
  would run it) reproduces the trial's objective with the same seed."""
  _, result, (crashed, _), _ = smoke
  exported = json.loads(open(os.path.join(result.sweep_dir, "export.json")).read())
  assert set(exported["best"]) == {"fedavg", "fedadamom"}
  runs = {}
  for optimizer, best in exported["best"].items():
    path = os.path.join(result.sweep_dir, best["config"])
    config = load_config(path)  # a complete experiment config
    assert config.server.optimizer == optimizer and config.rounds == 3
    runs[optimizer] = subprocess.Popen(
        [CLI, "run", path, "--quiet", "--set", f"output_dir={tmp_path / optimizer}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  for optimizer, process in runs.items():
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output.decode(errors="replace")[-3000:]
    with open(tmp_path / optimizer / "summary.json") as f:
      summary = json.load(f)
    best = exported["best"][optimizer]
    value = objective_from_history(summary["history"], TEST_ACCURACY, LAST_K)
    assert value == best["objective"], optimizer
    assert summary["rounds_to_target"] == best["rounds_to_target"]
    # Round for round, the crashed fedavg trial (restarted from its rung
    # checkpoint) included.
    ran = {int(row["round"]): row for row in summary["history"] if TEST_ACCURACY in row}
    assert sorted(ran) == [row["round"] for row in best["history"]] == [1, 2, 3]
    for row in best["history"]:
      for name in (TEST_ACCURACY, TEST_LOSS):  # bit for bit
        assert ran[row["round"]][name] == row[name], (optimizer, row["round"], name)
  assert exported["best"]["fedavg"]["trial_id"] == crashed
  for name in ("leaderboard.md", "plots/objective_vs_hparams.png",
               "plots/best_learning_curves.png"):
    assert os.path.getsize(os.path.join(result.sweep_dir, name)) > 100


def test_no_worker_binary_left_by_trials(smoke):
  assert not our_worker_binaries()


def test_rerun_without_resume_is_refused(smoke):
  path, _, _, _ = smoke
  with pytest.raises(SweepError, match="--resume"):
    run_sweep(path)


def _trial_reports(sweep_dir):
  """Trial directory -> the lines of its result.json (one per report), of the
  sweep's one experiment."""
  experiment = os.path.join(sweep_dir, joint.EXPERIMENT)
  out = {}
  for name in sorted(os.listdir(experiment)):
    if name.startswith("trial_"):
      with open(os.path.join(experiment, name, "result.json")) as f:
        out[name] = f.read().splitlines()
  return out


def test_one_experiment_runs_the_planned_trials(smoke):
  """A grid sweep is one Tune experiment holding exactly the trials
  `joint.trial_configs` planned, interleaved across optimizers."""
  path, result, _, _ = smoke
  entries = sorted(os.listdir(result.sweep_dir))
  assert joint.EXPERIMENT in entries and "fedavg" not in entries and "fedadamom" not in entries
  from tuning import load_sweep

  planned = joint.trial_configs(load_sweep(path))
  assert [t["optimizer"] for t in planned] == ["fedavg", "fedadamom"] * 2
  ran = [dict(r.config[joint.TRIAL_KEY]) for grid in result.results.values() for r in grid]
  key = lambda t: sorted(t.items())  # noqa: E731
  assert sorted(ran, key=key) == sorted(planned, key=key)


def test_resume_of_a_finished_sweep_runs_nothing(smoke):
  path, result, _, _ = smoke
  before = _trial_reports(result.sweep_dir)
  assert len(before) == 4, before.keys()
  again = run_sweep(path, resume=True, progress_interval_s=60)
  for optimizer, grid in again.results.items():
    assert len(grid) == 2 and grid.num_terminated == 2
    assert sorted(r.metrics["trial_id"] for r in grid) == sorted(
        r.metrics["trial_id"] for r in result.results[optimizer])
    assert sum(not math.isfinite(r.metrics["objective"]) for r in grid) == 0
  # No new trial directory and not a single new report in the old ones.
  assert _trial_reports(result.sweep_dir) == before


def test_resume_with_a_changed_sweep_or_nothing_to_resume_is_refused(smoke, tmp_path):
  import yaml

  path, _, _, _ = smoke
  with open(path) as f:
    raw = yaml.safe_load(f)
  raw["budget"]["rounds"] = 4
  with pytest.raises(SweepError, match="budget.rounds: differs from the sweep being resumed"):
    run_sweep(write_sweep(tmp_path, raw), resume=True)
  raw["name"] = "never-ran"
  with pytest.raises(SweepError, match="nothing to resume"):
    run_sweep(write_sweep(tmp_path, raw), resume=True)
