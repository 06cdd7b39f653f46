"""One Tune experiment for all optimizers (tuning.joint): the planned trials are
seeded per optimizer and the same in any process, interleaved across optimizers,
and early stopping compares an optimizer's trials with its own only."""

import json
import os
import subprocess
import sys
import types

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search import Searcher

from tests.helpers import tiny_base
from tuning import joint, schema
from tuning import space as space_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sweep(optimizers=("fedavg", "fedadam", "fedadamom"), **overrides):
  raw = {
      "name": "joint",
      "base": tiny_base(),
      "optimizers": list(optimizers),
      "budget": {"trials_per_optimizer": 3, "rounds": 3},
      "search": {"kind": "random", "seed": 7},
      "resources": {"storage_path": "/nonexistent"},
  }
  raw.update(overrides)
  return schema.load_sweep(raw)


def test_random_trials_are_seeded_per_dimension():
  sweep = _sweep()
  fedadam = space_lib.sample_trials(sweep, "fedadam")
  assert fedadam == space_lib.sample_trials(sweep, "fedadam")  # the same again
  assert len(fedadam) == 3 and len({json.dumps(t, sort_keys=True) for t in fedadam}) == 3
  # Another optimizer list leaves fedadam's trials as they were...
  assert space_lib.sample_trials(_sweep(("fedadam",)), "fedadam") == fedadam
  # ...another search seed does not.
  reseeded = _sweep(search={"kind": "random", "seed": 8})
  assert space_lib.sample_trials(reseeded, "fedadam") != fedadam
  # Every value inside its dimension's range.
  space = space_lib.resolve(sweep, "fedadam")
  for trial in fedadam:
    assert set(trial) == set(space.tuned)
    for path, value in trial.items():
      dist = space.tuned[path]
      assert type(value) is float and dist.low <= value <= dist.high, (path, value)
  # Common random numbers: a dimension two optimizers share, with the same
  # range, gets the same values; dimensions are not copies of each other.
  fedavg = space_lib.sample_trials(sweep, "fedavg")
  shared = [p for p in space_lib.resolve(sweep, "fedavg").tuned
            if space_lib.resolve(sweep, "fedavg").tuned[p] == space.tuned.get(p)]
  assert "server.learning_rate" in shared and "client.learning_rate" in shared
  for path in shared:
    assert [t[path] for t in fedavg] == [t[path] for t in fedadam], path
  assert [t["server.learning_rate"] for t in fedadam] != [t["client.learning_rate"]
                                                         for t in fedadam]


def test_random_trials_are_the_same_in_another_process():
  code = ("import json; from tests.tuning.test_joint import _sweep; "
          "from tuning.space import sample_trials; "
          "print(json.dumps(sample_trials(_sweep(), 'fedadamom')))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "PYTHONHASHSEED": "123"}, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert json.loads(out.stdout.strip().splitlines()[-1]) == \
      space_lib.sample_trials(_sweep(), "fedadamom")


def test_integer_fields_draw_integers_and_choices_keep_their_types():
  sweep = _sweep(("fedavg",), space={
      "client.local_epochs": {"dist": "uniform", "low": 1, "high": 3},
      "client.batch_size": {"dist": "choice", "values": [8, 16]}},
      budget={"trials_per_optimizer": 12, "rounds": 3})
  trials = space_lib.sample_trials(sweep, "fedavg")
  assert {type(t["client.local_epochs"]) for t in trials} == {int}
  assert {t["client.local_epochs"] for t in trials} <= {1, 2, 3}
  assert {type(t["client.batch_size"]) for t in trials} == {int}
  assert {t["client.batch_size"] for t in trials} == {8, 16}


def test_a_grid_is_every_point_last_dimension_fastest():
  sweep = _sweep(("fedavg",), search={"kind": "grid"},
                 budget={"trials_per_optimizer": 4, "rounds": 3},
                 space={"server.learning_rate": {"dist": "grid", "values": [0.1, 1.0]},
                        "client.learning_rate": {"dist": "grid", "values": [0.01, 0.02]}})
  trials = space_lib.sample_trials(sweep, "fedavg")
  paths = list(space_lib.resolve(sweep, "fedavg").tuned)
  assert [[t[p] for p in paths] for t in trials] == [
      [a, b] for a in sweep.space[paths[0]].values for b in sweep.space[paths[1]].values]


def test_optuna_proposes_its_own_trials():
  with pytest.raises(ValueError, match="allowed: random, grid"):
    space_lib.sample_trials(_sweep(search={"kind": "optuna", "seed": 0}), "fedavg")


def test_trials_are_interleaved_across_optimizers():
  sweep = _sweep()
  configs = joint.trial_configs(sweep)
  assert [c["optimizer"] for c in configs] == list(sweep.optimizers) * 3
  for optimizer in sweep.optimizers:
    mine = [joint.split({joint.TRIAL_KEY: c})[1] for c in configs if c["optimizer"] == optimizer]
    assert mine == space_lib.sample_trials(sweep, optimizer)
  assert joint.trial_configs(sweep, ["fedadam"]) == [
      c for c in configs if c["optimizer"] == "fedadam"]


def test_split_reads_joint_and_flat_configs():
  nested = {joint.TRIAL_KEY: {"optimizer": "fedadam", "server.learning_rate": 0.1}}
  assert joint.split(nested) == ("fedadam", {"server.learning_rate": 0.1})
  assert nested[joint.TRIAL_KEY]["optimizer"] == "fedadam"  # not consumed
  assert joint.split({"server.learning_rate": 0.1}, "fedavg") == (
      "fedavg", {"server.learning_rate": 0.1})


class _Proposer(Searcher):
  """A searcher that proposes `lr` 1, 2, ... and records what it is told."""

  def __init__(self, pending_limit=None):
    super().__init__()
    self.proposed, self.told, self.limit = 0, [], pending_limit

  def suggest(self, trial_id):
    if self.limit is not None and self.proposed - len(self.told) >= self.limit:
      return None  # nothing to propose until a trial completes
    self.proposed += 1
    return {"lr": self.proposed}

  def on_trial_complete(self, trial_id, result=None, error=False):
    self.told.append((trial_id, result["objective"]))


def test_per_optimizer_search_asks_each_optimizer_in_turn_up_to_its_budget():
  made = {}
  search = joint.PerOptimizerSearch(lambda o: made.setdefault(o, _Proposer(pending_limit=(
      1 if o == "b" else None))), ["a", "b", "c"], trials_per_optimizer=2)
  assert search.set_search_properties("objective", "max", {})
  assert not search.set_search_properties("objective", "max", {"x": 1})  # its own spaces
  got = [search.suggest(f"t{i}") for i in range(5)]
  # b has one trial pending and nothing to propose: it is passed over.
  assert [g[joint.TRIAL_KEY]["optimizer"] if g else None for g in got] == [
      "a", "b", "c", "a", "c"]
  assert got[0] == {joint.TRIAL_KEY: {"optimizer": "a", "lr": 1}}
  assert search.suggest("t5") is None  # b waits for its trial
  search.on_trial_complete("t1", {"objective": 0.5})
  assert made["b"].told == [("t1", 0.5)] and made["a"].told == []  # routed to its owner
  assert search.suggest("t6")[joint.TRIAL_KEY] == {"optimizer": "b", "lr": 2}
  assert search.suggest("t7") == Searcher.FINISHED  # every optimizer has its 2
  assert {o: s.proposed for o, s in made.items()} == {"a": 2, "b": 2, "c": 2}


def test_per_optimizer_search_saves_and_restores_its_studies(tmp_path):
  from ray.tune.search.optuna import OptunaSearch

  def study(optimizer):
    space = OptunaSearch.convert_search_space({"lr": tune.loguniform(1e-3, 1.0)})
    return OptunaSearch(space=space, metric="objective", mode="max", seed=0)

  search = joint.PerOptimizerSearch(study, ["a", "b"], trials_per_optimizer=3)
  first = [search.suggest(f"t{i}") for i in range(2)]
  for i in range(2):
    search.on_trial_complete(f"t{i}", {"objective": float(i)})
  search.save(str(tmp_path / "search.pkl"))
  restored = joint.PerOptimizerSearch(study, ["a", "b"], trials_per_optimizer=3)
  restored.restore(str(tmp_path / "search.pkl"))
  assert restored.suggest("t2") == search.suggest("t2")
  assert [f[joint.TRIAL_KEY]["optimizer"] for f in first] == ["a", "b"]
  assert all(1e-3 <= f[joint.TRIAL_KEY]["lr"] <= 1.0 for f in first)


class _Trial:
  def __init__(self, trial_id, optimizer):
    self.trial_id = trial_id
    self.config = {joint.TRIAL_KEY: {"optimizer": optimizer}}


def _asha():
  return ASHAScheduler(time_attr="round", max_t=8, grace_period=1, reduction_factor=2)


def _feed(scheduler, reports):
  """Adds every trial, then reports round 1 of each in order; their decisions."""
  scheduler.set_search_properties("objective", "max")
  trials = {tid: _Trial(tid, opt) for tid, opt, _ in reports}
  for trial in trials.values():
    scheduler.on_trial_add(None, trial)
  return [scheduler.on_trial_result(None, trials[tid], {"round": 1, "objective": value})
          for tid, _, value in reports]


def test_early_stopping_compares_an_optimizer_with_itself_only():
  reports = [("a1", "good", 0.9), ("a2", "good", 0.8), ("b1", "poor", 0.2),
             ("b2", "poor", 0.1)]
  # One ASHA for all: the poor optimizer's first trial is cut by the good one's.
  shared = _feed(_asha(), reports)
  assert shared[2] == TrialScheduler.STOP
  per_optimizer = _feed(joint.PerOptimizerScheduler(_asha, ["good", "poor"]), reports)
  assert per_optimizer == [TrialScheduler.CONTINUE, TrialScheduler.STOP,
                           TrialScheduler.CONTINUE, TrialScheduler.STOP]
  # The same decisions as a separate ASHA per optimizer.
  alone = _feed(_asha(), reports[:2]) + _feed(_asha(), reports[2:])
  assert per_optimizer == alone


def test_the_scheduler_survives_save_and_restore(tmp_path):
  scheduler = joint.PerOptimizerScheduler(_asha, ["good", "poor"])
  _feed(scheduler, [("a1", "good", 0.9)])
  scheduler.save(str(tmp_path / "s.pkl"))
  restored = joint.PerOptimizerScheduler(_asha, ["good", "poor"])
  restored.restore(str(tmp_path / "s.pkl"))
  trial = _Trial("a2", "good")
  restored.on_trial_add(None, trial)
  assert restored.on_trial_result(None, trial, {"round": 1, "objective": 0.1}) == \
      TrialScheduler.STOP  # judged against a1, which only the saved state knew
  assert "good:" in restored.debug_string() and "poor:" in restored.debug_string()


def test_one_optimizer_gets_its_asha_and_the_newest_pending_trial_first():
  """A sweep's scheduler is one ASHA per optimizer; with one optimizer it judges
  every trial as Tune's own ASHA would."""
  from tuning import sweep as sweep_lib

  sweep = _sweep(search={"kind": "optuna", "seed": 0},
                 scheduler={"kind": "asha", "grace_period": 1, "reduction_factor": 2})
  scheduler = sweep_lib._scheduler(sweep)
  assert isinstance(scheduler, joint.PerOptimizerScheduler)
  assert isinstance(sweep_lib._scheduler(_sweep(scheduler={"kind": "none"})),
                    joint.NewestPendingFirst)
  reports = [("a1", 0.9), ("a2", 0.8), ("a3", 0.95), ("a4", 0.1)]

  def feed(scheduler):
    scheduler.set_search_properties("objective", "max")
    trials = {tid: types.SimpleNamespace(trial_id=tid, config={"x": 1}) for tid, _ in reports}
    for trial in trials.values():
      scheduler.on_trial_add(None, trial)
    return [scheduler.on_trial_result(None, trials[tid], {"round": 1, "objective": value})
            for tid, value in reports]

  decisions = feed(joint.PerOptimizerScheduler(_asha, ["fedadam"]))
  assert decisions == feed(_asha()) and TrialScheduler.STOP in decisions


@pytest.mark.parametrize("scheduler", [
    joint.NewestPendingFirst(), joint.PerOptimizerScheduler(_asha, ["good", "poor"]),
    joint.PerOptimizerScheduler(_asha, ["only"])])
def test_the_newest_pending_trial_starts_first_then_the_oldest_paused(scheduler):
  """Tune gives a finished trial's cached actor to the trial its scheduler
  chooses, removing a new actor already starting for it: the newest pending
  trial, which the searcher has just added, has none yet."""
  from ray.tune.experiment import Trial

  def controller(*statuses):
    trials = [types.SimpleNamespace(trial_id=str(i), status=s) for i, s in enumerate(statuses)]
    return types.SimpleNamespace(get_trials=lambda: trials), trials

  running, pending, paused = Trial.RUNNING, Trial.PENDING, Trial.PAUSED
  tune_controller, trials = controller(running, pending, pending, Trial.TERMINATED)
  assert scheduler.choose_trial_to_run(tune_controller) is trials[2]
  tune_controller, trials = controller(paused, running, paused)
  assert scheduler.choose_trial_to_run(tune_controller) is trials[0]
  tune_controller, trials = controller(paused, pending)
  assert scheduler.choose_trial_to_run(tune_controller) is trials[1]
  tune_controller, _ = controller(running, Trial.TERMINATED)
  assert scheduler.choose_trial_to_run(tune_controller) is None
