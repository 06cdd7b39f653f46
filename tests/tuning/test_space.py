"""Search spaces: the registry decides which hparams each optimizer gets."""

import math

import pytest

from tests.helpers import tiny_base
from tff_fedadamom.config import load_config
from tff_fedadamom.metric_names import TEST_ACCURACY, TEST_LOSS, TRAIN_LOSS
from tff_fedadamom.methods import get_spec, list_optimizers
from tuning import load_sweep
from tuning import space as space_lib
from tuning.trainable import objective_from_history, worst_objective


def _sweep(**overrides):
  raw = {"name": "t", "base": tiny_base(server={"optimizer": "fedadamom", "beta_2": 0.07}),
         "optimizers": list_optimizers(), "budget": {"trials_per_optimizer": 2, "rounds": 3}}
  raw.update(overrides)
  return load_sweep(raw)


def _server_hparams(space):
  return {p.split(".", 1)[1] for p in space.tuned if p.startswith("server.")}


def test_defaults_apply_only_to_registered_hparams():
  sweep = _sweep()
  for optimizer in sweep.optimizers:
    space = space_lib.resolve(sweep, optimizer)
    assert _server_hparams(space) == set(get_spec(optimizer).tunable), optimizer
    assert "client.learning_rate" in space.tuned
  fedadamom = space_lib.resolve(sweep, "fedadamom").tuned
  assert (fedadamom["server.beta_2"].low, fedadamom["server.beta_2"].high) == (0.01, 0.3)
  fedadam = space_lib.resolve(sweep, "fedadam").tuned
  assert fedadam["server.beta_2"].low >= 0.9
  assert fedadam["server.learning_rate"].dist == "loguniform"
  assert (fedadam["server.learning_rate"].low, fedadam["server.learning_rate"].high) == (
      1e-3, 10.0)
  assert set(space_lib.resolve(sweep, "fedavg").tuned) == {"server.learning_rate",
                                                           "client.learning_rate"}


def test_shared_entry_only_where_the_hparam_exists_and_overrides_layer():
  sweep = _sweep(space={
      "server.epsilon": {"dist": "loguniform", "low": 1.0e-4, "high": 1.0e-2},
      "server.momentum": None,                       # not tuned: registry default
      "client.local_epochs": {"dist": "uniform", "low": 1, "high": 3},
      "fedadamom": {"server.beta_2": 0.1},           # fixed for fedadamom only
  })
  for optimizer in sweep.optimizers:
    space = space_lib.resolve(sweep, optimizer)
    has_eps = "epsilon" in get_spec(optimizer).tunable
    assert ("server.epsilon" in space.tuned) == has_eps
    if has_eps:
      assert space.tuned["server.epsilon"].low == 1e-4
    assert "server.momentum" not in space.tuned
    assert "client.local_epochs" in space.integer
  fedadamom = space_lib.resolve(sweep, "fedadamom")
  assert "server.beta_2" not in fedadamom.tuned and fedadamom.fixed == {
      "server.beta_2": 0.1}


def test_tune_space_types():
  from ray.tune.search.sample import Categorical, Float, Integer

  sweep = _sweep(space={"client.local_epochs": {"dist": "uniform", "low": 1, "high": 3},
                        "client.batch_size": {"dist": "choice", "values": [10, 20]}})
  domains = space_lib.tune_space(space_lib.resolve(sweep, "fedadamom"))
  assert isinstance(domains["server.learning_rate"], Float)
  assert "LogUniform" in type(domains["server.learning_rate"].get_sampler()).__name__
  assert isinstance(domains["client.local_epochs"], Integer)
  assert (domains["client.local_epochs"].lower, domains["client.local_epochs"].upper) == (
      1, 4)
  assert isinstance(domains["client.batch_size"], Categorical)


def test_experiment_dict_switches_optimizer_and_drops_foreign_hparams():
  sweep = _sweep()
  tree = space_lib.experiment_dict(sweep, "fedavg", {"server.learning_rate": 0.5},
                                   output_dir="x/y", name="n", threads=1)
  config = load_config(tree)
  assert config.server.optimizer == "fedavg"
  assert config.server.hparams == {"learning_rate": 0.5}  # no beta_2 from the base
  assert (config.rounds, config.output_dir, config.name, config.runtime.threads) == (
      3, "x/y", "n", 1)
  same = load_config(space_lib.experiment_dict(sweep, "fedadamom", {}, output_dir="z"))
  assert same.server.hparams["beta_2"] == 0.07  # the base optimizer keeps its values


def test_objective_from_history():
  rows = [{"round": 1, TEST_ACCURACY: 0.1}, {"round": 2, TRAIN_LOSS: 1.0},  # no eval
          {"round": 2, TEST_ACCURACY: 0.3}, {"round": 3, TEST_ACCURACY: 0.5},
          {"round": 3, TEST_ACCURACY: 0.7}]  # round 3 twice: a resumed run
  assert objective_from_history(rows, TEST_ACCURACY, 2) == pytest.approx(0.5)
  assert objective_from_history(rows, TEST_ACCURACY, 9) == pytest.approx(
      (0.1 + 0.3 + 0.7) / 3)
  assert objective_from_history(rows, TEST_ACCURACY, 1, upto_round=2) == 0.3
  assert objective_from_history(rows, TEST_LOSS, 1) is None
  assert math.isnan(objective_from_history([{"round": 1, TEST_LOSS: math.inf}],
                                           TEST_LOSS, 1))
  assert worst_objective("max") < -1e299 and worst_objective("min") > 1e299
  assert math.isfinite(worst_objective("max"))


def test_train_metric_objective_counts_evaluation_rounds_only():
  rows = [{"round": 1, TRAIN_LOSS: 3.0}, {"round": 2, TRAIN_LOSS: 2.0, TEST_LOSS: 9},
          {"round": 3, TRAIN_LOSS: 1.0}, {"round": 4, TRAIN_LOSS: 0.5, TEST_LOSS: 8}]
  assert objective_from_history(rows, TRAIN_LOSS, 2) == pytest.approx(1.25)


def test_bias_correction_is_a_switch_a_sweep_may_fix_or_choose():
  adam_family = {"fedadam", "fedyogi", "fedamsgrad", "fadas"}
  sweep = _sweep(space={"server.bias_correction": False})
  for optimizer in sweep.optimizers:
    space = space_lib.resolve(sweep, optimizer)
    assert ("server.bias_correction" in space.fixed) == (optimizer in adam_family)
    assert "server.bias_correction" not in space.tuned  # never a default dimension
  tree = space_lib.experiment_dict(sweep, "fedadam", {}, output_dir="o")
  assert load_config(tree).server.hparams["bias_correction"] is False

  choice = {"dist": "choice", "values": [True, False]}
  sweep = _sweep(optimizers=["fedadam", "fadas", "fedavg"],
                 space={"server.bias_correction": choice})
  for optimizer in ("fedadam", "fadas"):
    dist = space_lib.resolve(sweep, optimizer).tuned["server.bias_correction"]
    assert list(dist.values) == [True, False]
  assert "server.bias_correction" not in space_lib.resolve(sweep, "fedavg").tuned
  for value in (True, False):
    tree = space_lib.experiment_dict(sweep, "fadas", {"server.bias_correction": value},
                                     output_dir="o")
    assert load_config(tree).server.hparams["bias_correction"] is value


def test_bias_correction_must_be_chosen_from_bools():
  from tuning.schema import SweepConfigError

  with pytest.raises(SweepConfigError, match="server.bias_correction"):
    _sweep(optimizers=["fedadam"],
           space={"server.bias_correction": {"dist": "uniform", "low": 0, "high": 1}})
  with pytest.raises(SweepConfigError, match="no optimizer .* has the tunable hparam"):
    _sweep(optimizers=["fedavg"],
           space={"server.bias_correction": {"dist": "choice", "values": [True, False]}})


def test_a_field_of_an_asynchronous_base_is_a_search_dimension():
  base = tiny_base(asynchronous={"concurrency": 5, "staleness": {"kind": "polynomial"}})
  sweep = load_sweep({"name": "t", "base": base, "optimizers": ["fadas"],
                      "budget": {"trials_per_optimizer": 3, "rounds": 2},
                      "space": {"asynchronous.staleness.a":
                                {"dist": "uniform", "low": 0.1, "high": 1.0}}})
  trials = space_lib.sample_trials(sweep, "fadas")
  values = [t["asynchronous.staleness.a"] for t in trials]
  assert len(set(values)) == 3 and all(0.1 <= v <= 1.0 for v in values)
  config = load_config(space_lib.experiment_dict(sweep, "fadas", trials[0], output_dir="x"))
  assert config.asynchronous.staleness == {"kind": "polynomial", "a": values[0]}
  assert config.asynchronous.concurrency == 5
