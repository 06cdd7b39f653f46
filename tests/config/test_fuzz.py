"""Property-based fuzzing of the config loader: the only failure is ConfigError."""

import math

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.config.schema import SECTIONS

KEYS = (["rounds", "seed", "clients_per_round", "eval_every", "checkpoint_every", "targets",
         "telemetry", "output_dir", "name", "histogram_every", "diverge_patience",
         "roundz", "!!python/object"] + list(SECTIONS))
SECTION_KEYS = ["name", "path", "num_clients", "seed", "partition", "options", "augment",
                "learning_rate", "momentum", "weight_decay", "lr_decay", "local_epochs",
                "batch_size", "clip_norm", "optimizer", "beta_2", "epsilon",
                "client_weighting", "schedule", "kind", "alpha", "threads", "hidden"]
NAMES = ["digits", "fashion_mnist", "cifar10", "shakespeare", "synthetic", "cnn", "mlp",
         "fedadamom", "fedavg", "dirichlet", "shards", "cosine", "uniform", "bogus", ""]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(NAMES),
    st.text(max_size=8))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(SECTION_KEYS), inner, max_size=5)),
    max_leaves=12)
configs = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)


def _load(raw):
  try:
    load_config(raw)
  except ConfigError as e:
    assert e.field is not None and str(e)
    return False
  return True


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(configs)
def test_random_mappings_fail_only_with_config_error(raw):
  _load(raw)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["rounds", "client.learning_rate", "server.beta_2", "server.epsilon",
                        "data.num_clients", "data.partition.alpha", "client.batch_size",
                        "server.learning_rate", "targets"]),
       values)
def test_any_value_at_a_known_field_fails_only_with_config_error(field, value):
  raw = {"data": {"name": "digits", "num_clients": 10}, "model": {"name": "logistic"},
         "server": {"optimizer": "fedadamom"}}
  node = raw
  *parents, leaf = field.split(".")
  for key in parents:
    node = node.setdefault(key, {})
  node[leaf] = value
  if _load(raw) and isinstance(value, float):
    assert math.isfinite(value)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(max_size=200))
def test_random_yaml_text_fails_only_with_config_error(tmp_path_factory, text):
  path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
  path.write_text(text)
  try:
    load_config(str(path))
  except ConfigError:
    pass


def test_python_tags_never_construct(tmp_path):
  path = tmp_path / "c.yaml"
  path.write_text(yaml.dump({"rounds": 3}) + "x: !!python/object/new:os.system [echo]\n")
  try:
    load_config(str(path))
  except ConfigError as e:
    assert "not valid YAML" in str(e)
  else:
    raise AssertionError("a python tag was accepted")
