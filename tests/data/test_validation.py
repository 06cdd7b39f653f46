"""A validation set held out from the training clients (`data.validation`): its
size, disjointness and determinism, and a run that evaluates on it beside the
test set; a sweep may tune on it only when its base holds one out."""

import collections

import numpy as np
import pytest

from tests.helpers import metrics_rows, tiny, tiny_base
from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.data import ArrayClientData
from tff_fedadamom.data.base import FederatedData
from tff_fedadamom.data.validation import hold_out_validation
from tff_fedadamom.experiment import run_experiment
from tff_fedadamom.metric_names import TEST_ACCURACY, VALIDATION_ACCURACY, VALIDATION_LOSS


def _data(sizes=(10, 7, 1, 25)):
  """Clients whose examples are numbered 0, 1, ... across clients."""
  start, clients = 0, {}
  for i, n in enumerate(sizes):
    x = np.arange(start, start + n, dtype=np.float32)[:, None]
    clients[f"c{i}"] = collections.OrderedDict(x=x, y=np.zeros(n, np.int32))
    start += n
  return FederatedData("toy", ArrayClientData(clients), test=None, input_shape=(1,),
                       num_classes=2)


def test_each_client_gives_its_share_and_keeps_the_rest_in_order():
  data = _data()
  split = hold_out_validation(data, 0.3, seed=4)
  held = sorted(float(e["x"][0]) for e in split.validation)
  kept = {c: split.train.client_arrays(c)["x"][:, 0] for c in split.train.client_ids}
  assert [len(kept[c]) for c in ("c0", "c1", "c2", "c3")] == [7, 5, 1, 18]  # n - int(0.3 n)
  assert len(held) == 3 + 2 + 0 + 7
  everything = sorted(held + [float(v) for k in kept.values() for v in k])
  assert everything == list(map(float, range(43)))  # disjoint, nothing lost
  assert all(np.all(np.diff(k) > 0) for k in kept.values())  # order kept
  again = hold_out_validation(data, 0.3, seed=4)
  assert sorted(float(e["x"][0]) for e in again.validation) == held
  other = hold_out_validation(data, 0.3, seed=5)
  assert sorted(float(e["x"][0]) for e in other.validation) != held
  with pytest.raises(ValueError, match="fraction"):
    hold_out_validation(data, 1.0, seed=0)


def test_a_run_evaluates_the_validation_set_beside_the_test_set(tmp_path):
  raw = tiny(tmp_path / "run", rounds=2, eval_every=2)
  raw["validation"] = {"fraction": 0.2}
  run_experiment(raw, progress=False)
  row = metrics_rows(tmp_path / "run")[-1]
  assert float(row[VALIDATION_LOSS]) > 0 and 0 <= float(row[VALIDATION_ACCURACY]) <= 1
  assert row[VALIDATION_ACCURACY] != row[TEST_ACCURACY]
  with pytest.raises(ConfigError, match="validation.fraction"):
    load_config({**raw, "validation": {"fraction": 0}})


def test_a_sweep_tunes_on_validation_only_when_its_base_holds_it_out():
  from tuning.schema import parse_sweep
  from tuning.errors import SweepConfigError

  sweep = {"base": tiny_base(), "optimizers": ["fedavg"],
           "budget": {"trials_per_optimizer": 1, "rounds": 2},
           "metric": {"name": VALIDATION_ACCURACY}}
  with pytest.raises(SweepConfigError, match="metric.name"):
    parse_sweep(sweep)
  parsed = parse_sweep({**sweep, "base": tiny_base(validation={"fraction": 0.1})})
  assert parsed.metric.name == VALIDATION_ACCURACY and parsed.metric.mode == "max"
