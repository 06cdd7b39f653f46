"""Checking hparams builds nothing, and refuses exactly what building refuses."""

import re

import pytest
import tensorflow_federated as tff

from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom import methods as registry

# The server optimizers and each bool switch flipped (a different builder for
# FedAdam and FedYogi: TFF's corrected Adam and Yogi, or ours uncorrected).
NAMES = [n for n in registry.list_optimizers() if not registry.is_learning_process(n)]
VARIANTS = [(name, {}) for name in NAMES] + [
    (name, {hparam: not default}) for name in NAMES
    for hparam, default in registry.default_hparams(name).items() if isinstance(default, bool)]
# Below, at and above each range's ends ([0, 1], >= 0, > 0, (0, 1]).
PROBES = (-1.0, -1e-9, 0.0, 1e-9, 0.5, 1.0, 1.0 + 1e-9, 7.0)
# TFF's own messages that do not name the registry's hparam: (theirs, ours).
TFF_SPELLINGS = {("`initial_preconditioner_value`", "`initial_preconditioner`")}


def _error(call, *args, **kwargs):
  try:
    call(*args, **kwargs)
  except ValueError as e:
    return str(e)
  return None


@pytest.mark.parametrize("name,switches", VARIANTS,
                         ids=[n + "".join(f"-{k}={v}" for k, v in s.items())
                              for n, s in VARIANTS])
def test_a_check_refuses_what_building_refuses(name, switches):
  numbers = [h for h, v in registry.default_hparams(name).items() if not isinstance(v, bool)]
  compared = 0
  for hparam in numbers:
    for value in PROBES:
      hparams = {**switches, hparam: value}
      built = _error(registry.build_server_optimizer, name, **hparams)
      checked = _error(registry.check_hparams, name, **hparams)
      assert (built is None) == (checked is None), (hparam, value, built, checked)
      if built is not None:
        for theirs, ours in TFF_SPELLINGS:
          built = built.replace(theirs, ours)
        # Named by the hparam, or by the one its value makes invalid (an
        # AMSGrad v_hat_0 of 0 needs epsilon > 0).
        assert checked == built and re.search(r"`\w+` must be", checked)
        compared += 1
  assert compared >= len(numbers)  # every hparam has a range with a refused probe
  for value in (1, "yes"):
    if "bias_correction" in registry.default_hparams(name):
      assert _error(registry.check_hparams, name, bias_correction=value) == _error(
          registry.build_server_optimizer, name, bias_correction=value) is not None


@pytest.fixture
def no_optimizer_built(monkeypatch):
  """Makes every registry entry's builder raise (the only way the registry, and
  so validation, could build an optimizer or a learning process).

  Patching `Optimizer.__new__` instead would be caught too late to undo: a class
  whose `__new__` was ever set keeps refusing constructor arguments after it is
  put back or deleted, and every optimizer built after the test would fail.
  """
  import dataclasses

  def refuse(*args, **kwargs):
    raise AssertionError("an optimizer was built")

  for name, spec in registry.OPTIMIZERS.items():
    monkeypatch.setitem(registry.OPTIMIZERS, name, dataclasses.replace(spec, builder=refuse))
  with pytest.raises(AssertionError, match="was built"):
    registry.build_server_optimizer("fedadam")  # the patch catches a build


@pytest.mark.parametrize("name", registry.list_optimizers())
def test_validating_a_config_builds_no_optimizer(name, no_optimizer_built):
  raw = {"rounds": 3, "data": {"name": "digits", "num_clients": 10},
         "model": {"name": "logistic"}, "server": {"optimizer": name, "learning_rate": 0.5}}
  config = load_config(raw)
  assert config.server.hparams == {**registry.default_hparams(name), "learning_rate": 0.5}
  raw["server"]["learning_rate"] = -1.0
  with pytest.raises(ConfigError) as info:
    load_config(raw)
  assert info.value.field == "server.learning_rate"
  assert "found -1.0" in str(info.value)


def test_validating_a_schedule_builds_none(monkeypatch):
  """The schedule is checked against its entry's ranges, with the same errors
  as building it, but no schedule function is made."""
  from tff_fedadamom.optimizers import schedules

  def refuse(*args, **kwargs):
    raise AssertionError("a schedule was built")

  raw = {"rounds": 3, "data": {"name": "digits", "num_clients": 10},
         "model": {"name": "logistic"},
         "server": {"optimizer": "fedadam", "schedule": {"kind": "cosine", "decay_rounds": 5}}}
  want = _error(schedules.build_schedule, "cosine", 1.0, decay_rounds=5, alpha=2)
  monkeypatch.setattr(schedules, "build_schedule", refuse)
  assert load_config(raw).server.schedule == {"kind": "cosine", "decay_rounds": 5}
  raw["server"]["schedule"]["alpha"] = 2
  with pytest.raises(ConfigError) as info:
    load_config(raw)
  assert info.value.field == "server.schedule.alpha"
  assert want is not None and want in str(info.value)
