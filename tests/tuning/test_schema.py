"""The sweep schema: every mistake is a SweepConfigError naming file, field,
value and what is allowed, before anything runs."""

import os

import pytest
import yaml

from tests.helpers import tiny_base
from tests.tuning.conftest import write_sweep
from tff_fedadamom.metric_names import TEST_ACCURACY, TEST_LOSS
from tff_fedadamom.methods import list_optimizers
from tuning import load_sweep
from tuning.schema import SweepConfigError, sweep_to_dict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sweep(**overrides):
  raw = {"name": "t", "base": tiny_base(), "optimizers": ["fedavg", "fedadamom"],
         "budget": {"trials_per_optimizer": 2, "rounds": 3}}
  raw.update(overrides)
  return raw


def _error(tmp_path, raw) -> SweepConfigError:
  path = write_sweep(tmp_path, raw)
  with pytest.raises(SweepConfigError) as info:
    load_sweep(path)
  assert path in str(info.value)  # every message names the file
  return info.value


@pytest.mark.parametrize("name", ["quickstart.yaml", "fmnist_all_optimizers.yaml"])
def test_shipped_sweeps_are_valid(name):
  sweep = load_sweep(os.path.join(REPO, "configs", "sweeps", name))
  assert set(sweep.optimizers) == set(list_optimizers())  # every registered one


def test_defaults_and_round_trip(tmp_path):
  sweep = load_sweep(write_sweep(tmp_path, _sweep()))
  assert sweep.search.kind == "random" and sweep.scheduler.kind == "none"
  assert (sweep.metric.name, sweep.metric.last_k, sweep.metric.mode) == (
      TEST_ACCURACY, 1, "max")
  assert sweep.resources.address is None and sweep.resources.cpus_per_trial == 1
  again = load_sweep(sweep_to_dict(sweep))
  assert sweep_to_dict(again) == sweep_to_dict(sweep)


def test_loss_metric_defaults_to_min(tmp_path):
  sweep = load_sweep(write_sweep(tmp_path, _sweep(metric={"name": TEST_LOSS})))
  assert sweep.metric.mode == "min"


def test_base_path_is_relative_to_the_sweep_file(tmp_path):
  (tmp_path / "experiments").mkdir()
  with open(tmp_path / "experiments" / "base.yaml", "w") as f:
    yaml.safe_dump(tiny_base(), f)
  (tmp_path / "sweeps").mkdir()
  path = write_sweep(tmp_path / "sweeps", _sweep(base="../experiments/base.yaml"))
  assert load_sweep(path).base.data.name == "digits"


@pytest.mark.parametrize("raw, field, words", [
    (_sweep(optimisers=["fedavg"]), "optimisers", "did you mean 'optimizers'"),
    (_sweep(budget={"trials": 2, "rounds": 3}), "budget.trials",
     "did you mean 'trials_per_optimizer'"),
    (_sweep(budget={"rounds": 3}), "budget.trials_per_optimizer", "missing"),
    (_sweep(optimizers=["fedadamon"]), "optimizers[0]", "did you mean 'fedadamom'"),
    (_sweep(search={"kind": "bayes"}), "search.kind", "allowed: random, grid, optuna"),
    (_sweep(scheduler={"kind": "asha", "grace_period": 9}), "scheduler.grace_period",
     "[1, 3]"),
    (_sweep(metric={"name": "test/acc"}), "metric.name", f"did you mean '{TEST_ACCURACY}'"),
    (_sweep(metric={"last_k": 4}), "metric.last_k", "[1, 3]"),
    (_sweep(resources={"address": "not an address"}), "resources.address",
     "not a Ray address"),
    (_sweep(resources={"storage_path": "s3://bucket/x"}), "resources.storage_path",
     "not a local path"),
    (_sweep(resources={"gpus_per_trial": 1.5}), "resources.gpus_per_trial", "fraction"),
    (_sweep(space={"server.learning_rate": {"dist": "lognormal", "low": 1, "high": 2}}),
     "space.server.learning_rate.dist", "allowed: loguniform, uniform, choice, grid"),
    (_sweep(space={"server.learning_rate": {"dist": "loguniform", "low": 0, "high": 1}}),
     "space.server.learning_rate.low", "a number > 0"),
    (_sweep(space={"server.learning_rate": {"dist": "uniform", "low": 2, "high": 1}}),
     "space.server.learning_rate.high", "greater than low"),
    (_sweep(space={"server.learning_rate": {"dist": "loguniform", "low": "1e-3",
                                            "high": 1.0}}),
     "space.server.learning_rate.low", "YAML read this as a string"),
    (_sweep(space={"server.learning_rate": {"dist": "choice", "low": 1, "values": [1]}}),
     "space.server.learning_rate.low", "unknown key"),
    (_sweep(space={"server.beta_1": {"dist": "uniform", "low": 0.8, "high": 0.9}}),
     "space.server.beta_1", "no optimizer in ['fedavg', 'fedadamom'] has the tunable "
     "hparam 'beta_1'"),
    (_sweep(space={"fedavg": {"server.beta_2": {"dist": "uniform", "low": 0.1,
                                                "high": 0.2}}}),
     "space.fedavg.server.beta_2", "optimizer 'fedavg' has no tunable hparam 'beta_2'"),
    (_sweep(space={"fedyogi": {"server.epsilon": 0.1}}), "space.fedyogi",
     "not in 'optimizers'"),
    (_sweep(space={"server.optimizer": {"dist": "choice", "values": ["fedavg"]}}),
     "space.server.optimizer", "cannot be searched"),
    (_sweep(space={"klient.learning_rate": 0.1}), "space.klient.learning_rate",
     "not a section"),
    (_sweep(space={"client.learning_rate": {"dist": "uniform", "low": -1.0, "high": 1.0}}),
     "space.client.learning_rate", "client.learning_rate=-1.0 gives an invalid experiment for optimizer 'fedavg': client.learning_rate: out of range"),
    (_sweep(space={"client.learning_rte": 0.2}), "space", "did you mean 'learning_rate'"),
    (_sweep(space={"server.learning_rate": {"dist": "grid", "values": [0.1, 1.0]}}),
     "space.server.learning_rate", "only goes with search.kind: grid"),
    (_sweep(search={"kind": "grid"}), "space.server.learning_rate", "needs every tuned dimension"),
    (_sweep(search={"kind": "grid"}, space={
        "client.learning_rate": None, "server.epsilon": None, "server.beta_2": None,
        "server.learning_rate": {"dist": "grid", "values": [0.1, 1.0]},
        "fedadamom": {"server.epsilon": {"dist": "grid", "values": [1.0e-3, 1.0e-2]}}}),
     "budget.trials_per_optimizer", "the grid of 'fedadamom' has 4 points"),
    (_sweep(base={**tiny_base(), "rounds": "ten"}), "base", "rounds"),
    (_sweep(base="missing.yaml"), "base", "experiment config not found"),
    (_sweep(name="a/b"), "name", "not a usable directory name"),
    (_sweep(base={**tiny_base(), "runtime": {"backend": "ray"}}), "base.runtime.backend",
     "allowed: 'auto', 'inprocess' or 'tff_cpp'"),
])
def test_errors_name_field_value_and_allowed(tmp_path, raw, field, words):
  error = _error(tmp_path, raw)
  assert error.field.startswith(field), (error.field, str(error))
  assert words in str(error), str(error)


def test_duplicate_keys_are_refused(tmp_path):
  path = tmp_path / "dup.yaml"
  path.write_text("name: a\nname: b\n")
  with pytest.raises(SweepConfigError, match="duplicate key 'name'"):
    load_sweep(str(path))


def test_not_a_mapping_and_missing_file(tmp_path):
  path = tmp_path / "list.yaml"
  path.write_text("- 1\n- 2\n")
  with pytest.raises(SweepConfigError, match="mapping of sections"):
    load_sweep(str(path))
  with pytest.raises(SweepConfigError, match="sweep file not found"):
    load_sweep(str(tmp_path / "nope.yaml"))


def test_schedule_parameters_are_sweepable_like_any_hparam():
  import yaml as _yaml

  from tuning import SweepConfigError, load_sweep

  raw = _yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                          "sweeps", "quickstart.yaml")))
  raw["base"]["server"]["schedule"] = {"kind": "exponential"}
  # A schedule drives a server optimizer's rate: whole learning processes
  # (FedCAda, FAFED) have none, and refuse one.
  from tff_fedadamom.methods import is_learning_process
  raw["optimizers"] = [n for n in raw["optimizers"] if not is_learning_process(n)]
  raw["space"]["server.schedule.decay_rate"] = {"dist": "uniform", "low": 0.9, "high": 0.999}
  sweep = load_sweep(raw)
  assert "server.schedule.decay_rate" in sweep.space
  raw["space"]["server.schedule.decay_rate"] = {"dist": "uniform", "low": 0.9, "high": 1.5}
  with pytest.raises(SweepConfigError, match="decay_rate"):
    load_sweep(raw)


def test_the_tune_command_refuses_an_invalid_sweep_before_it_starts(tmp_path, capsys):
  """`tff-fedadamom tune` on a sweep file with a bad field: exit status 2, one
  line naming the field, and no sweep directory made."""
  from tff_fedadamom import cli

  path = tmp_path / "bad.yaml"
  path.write_text("name: bad\nbase: {}\noptimizers: [nosuch]\n"
                  f"resources: {{storage_path: {tmp_path / 'sweeps'}}}\n")
  assert cli.main(["tune", str(path)]) == 2
  err = capsys.readouterr().err
  assert err.startswith("sweep config error:") and "optimizers" in err, err
  assert not (tmp_path / "sweeps").exists()


def test_overrides_set_dotted_values_of_a_sweep_file(tmp_path):
  raw = _sweep()
  del raw["name"]
  path = write_sweep(tmp_path, raw)
  sweep = load_sweep(path, overrides=["budget.rounds=4", "optimizers=[fedadamom]",
                                      "base.client.learning_rate=0.05"])
  assert sweep.budget.rounds == 4 and sweep.optimizers == ("fedadamom",)
  assert sweep.base.client.learning_rate == 0.05
  # The default name is still the file's stem, whatever the overrides' text holds.
  assert sweep.name == os.path.splitext(os.path.basename(path))[0]
  again = load_sweep(sweep, overrides=["budget.rounds=5"])
  assert again.budget.rounds == 5 and again.name == sweep.name
  assert again.source.startswith(path)  # errors name the file the sweep came from
  with pytest.raises(SweepConfigError) as info:
    load_sweep(path, overrides=["budget.rounds=0"])
  assert "budget.rounds" in str(info.value) and "--set budget.rounds=0" in str(info.value)


def test_the_tune_command_refuses_a_bad_override_before_it_starts(tmp_path, capsys):
  from tff_fedadamom import cli

  path = write_sweep(tmp_path, _sweep(resources={"storage_path": str(tmp_path / "sweeps")}))
  for override, field in (("budget.rounds", "--set"), ("optimizers=[nosuch]", "optimizers")):
    assert cli.main(["tune", path, "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sweep config error:") and field in err, err
  assert not (tmp_path / "sweeps").exists()
