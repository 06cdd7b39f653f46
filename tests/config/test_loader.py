"""Config loading: schema, registries, errors that name the field, overrides."""

import dataclasses
import glob
import os
import pickle

import pytest
import yaml

from tff_fedadamom.config import (ConfigError, ExperimentConfig, ServerConfig, config_to_dict,
                                  dump_config, load_config)
from tff_fedadamom.config import loader, schema
from tests.helpers import ROOT

SHIPPED = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))

MINIMAL = {
    "rounds": 3,
    "data": {"name": "digits", "num_clients": 10},
    "model": {"name": "logistic"},
    "server": {"optimizer": "fedadam", "learning_rate": 0.03},
}


def test_shipped_configs_exist():
  names = {os.path.basename(p) for p in SHIPPED}
  assert {"quickstart.yaml", "fmnist_dir03.yaml", "shakespeare.yaml", "synthetic_1_1.yaml",
          "cifar10.yaml", "cifar100.yaml", "tiny_imagenet.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_every_shipped_config_validates(path):
  with open(path) as f:
    raw = yaml.safe_load(f)
  if raw["data"].get("path"):
    # User-supplied data sets: the config is complete; only the files are absent here.
    assert raw["data"]["name"] in ("cifar10", "cifar100", "tiny_imagenet")
  config = load_config(path)
  assert isinstance(config, ExperimentConfig)


def test_minimal_config_gets_defaults_and_resolved_hparams():
  config = load_config(MINIMAL)
  assert config.rounds == 3
  assert config.server.hparams == {"learning_rate": 0.03, "beta_1": 0.9, "beta_2": 0.999,
                                   "epsilon": 1e-3, "bias_correction": True}
  assert config.server.client_weighting == "uniform"
  assert config.client.learning_rate == 0.1


def test_dump_and_load_round_trip(tmp_path):
  config = load_config(MINIMAL, ["server.schedule.kind=cosine", "targets=[0.5]"])
  path = tmp_path / "c.yaml"
  dump_config(config, str(path))
  assert load_config(str(path)) == config
  assert config_to_dict(config)["server"]["learning_rate"] == 0.03


def test_a_validated_config_comes_back_unchanged(monkeypatch):
  """Validation runs once: a config `load_config` returned (or a pickled copy,
  as an actor receives it) is returned as it is, without asking the registries."""
  config = load_config(MINIMAL)

  def refuse(*args):
    raise AssertionError("validated again")

  monkeypatch.setattr(loader, "check_registries", refuse)
  assert load_config(config) is config
  copy = pickle.loads(pickle.dumps(config))
  assert load_config(copy) is copy


def test_a_changed_or_hand_built_config_is_validated():
  config = load_config(MINIMAL)
  changed = dataclasses.replace(config, server=ServerConfig(optimizer="fedadamm"))
  with pytest.raises(ConfigError, match="server.optimizer.*did you mean 'fedadamom'"):
    load_config(changed)
  built = ExperimentConfig(server=ServerConfig(optimizer="fedavgm"))
  assert built.server.hparams == {}
  assert load_config(built).server.hparams == {"learning_rate": 1.0, "momentum": 0.9}
  overridden = load_config(config, ["rounds=7"])
  assert (overridden.rounds, config.rounds) == (7, 3)


def test_a_validated_config_names_its_partition_and_schedule_kinds():
  """The kinds YAML may leave out are named once, by validation, so nothing
  downstream needs to know their defaults."""
  config = load_config({**MINIMAL, "data": {**MINIMAL["data"], "partition": {"alpha": 0.5}},
                        "server": {**MINIMAL["server"], "schedule": {}}})
  assert config.data.partition == {"kind": "dirichlet", "alpha": 0.5}
  assert config.server.schedule == {"kind": "constant"}
  assert load_config(config_to_dict(config)) == config


@pytest.mark.parametrize("backend,resolved", [("auto", "inprocess"), ("inprocess", "inprocess"),
                                              ("tff_cpp", "tff_cpp"), ("ray", "ray")])
def test_auto_means_the_in_process_backend(backend, resolved):
  config = load_config(MINIMAL, [f"runtime.backend={backend}"])
  assert schema.resolved_backend(config.runtime) == resolved


@pytest.mark.parametrize("override,field,fragment", [
    ("rounds=0", "rounds", "allowed: an integer >= 1"),
    ("rounds=2.5", "rounds", "an integer"),
    ("rounds=true", "rounds", "an integer"),
    ("seed=-1", "seed", ">= 0"),
    ("clients_per_round=11", "clients_per_round", "[1, 10]"),
    ("roundz=3", "roundz", "did you mean 'rounds'"),
    ("client.learning_rate=0", "client.learning_rate", "> 0"),
    ("client.learning_rate=.nan", "client.learning_rate", "finite"),
    ("client.learning_rate=1.0e+999", "client.learning_rate", "finite"),
    ("client.momentum=1.0", "client.momentum", "[0, 1)"),
    ("client.batch_size=abc", "client.batch_size", "an integer"),
    ("client.lr_decay=1.5", "client.lr_decay", "(0, 1]"),
    ("server.optimizer=fedyogy", "server.optimizer", "did you mean 'fedyogi'"),
    ("server.momentum=0.9", "server.momentum", "unknown key for optimizer 'fedadam'"),
    ("server.beta_2=1.5", "server.beta_2", "beta_2"),
    ("server.learning_rate=-1", "server.learning_rate", "nonnegative"),
    ("server.client_weighting=examples", "server.client_weighting", "'uniform'"),
    ("server.schedule.kind=linear", "server.schedule.kind", "constant"),
    ("runtime.workers=2", "runtime.workers", "allowed: null with backend 'auto', or backend 'ray'"),
    ("data.name=cifar11", "data.name", "did you mean 'cifar10'"),
    ("data.name=cifar10", "data.path", "needs local files"),
    ("data.partition.kind=dirichlett", "data.partition.kind", "did you mean 'dirichlet'"),
    ("data.partition.alfa=0.3", "data.partition.alfa", "did you mean 'alpha'"),
    ("data.partition.alpha=-1", "data.partition.alpha", "> 0"),
    ("data.options.foo=1", "data.options.foo", "unknown key"),
    ("data.augment=flip", "data.augment", "crop_flip"),
    ("model.options.hidden=3", "model.options.hidden", "unknown key"),
    ("targets=[1.5]", "targets[0]", "(0, 1]"),
    ("data=3", "data", "mapping"),
])
def test_errors_name_the_field(override, field, fragment):
  with pytest.raises(ConfigError) as info:
    load_config(MINIMAL, [override])
  assert info.value.field == field, str(info.value)
  assert fragment in str(info.value)
  assert "<dict>" in str(info.value)


def test_error_names_the_file(tmp_path):
  path = tmp_path / "bad.yaml"
  path.write_text("rounds: -3\ndata: {name: digits}\n")
  with pytest.raises(ConfigError, match=r"bad\.yaml.*rounds.*got -3"):
    load_config(str(path))


@pytest.mark.parametrize("text", [
    "!!python/object/apply:os.system ['echo hi']",
    "rounds: !!python/name:os.system",
    "rounds: [unclosed",
    "- just\n- a list\n",
    "rounds: 1\nrounds: 2\n",
    "",
])
def test_hostile_yaml_is_a_config_error(tmp_path, text):
  path = tmp_path / "c.yaml"
  path.write_text(text)
  with pytest.raises(ConfigError):
    load_config(str(path))


def test_missing_file():
  with pytest.raises(ConfigError, match="config file not found"):
    load_config("/nonexistent/config.yaml")


def test_override_syntax_errors():
  with pytest.raises(ConfigError, match="key.sub=value"):
    load_config(MINIMAL, ["rounds"])
  with pytest.raises(ConfigError, match="is not a section"):
    load_config(MINIMAL, ["rounds.x=1"])


def test_server_hparams_must_sit_flat():
  with pytest.raises(ConfigError, match="directly under 'server'"):
    load_config({**MINIMAL, "server": {"optimizer": "fedavg", "hparams": {"learning_rate": 1}}})
