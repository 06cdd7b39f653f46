"""The one rule for the best trial: the metric's mode, no diverged or non-finite
trial, and trials that ran the whole budget first."""

import math

import pytest

from tff_fedadamom.metric_names import TEST_ACCURACY
from tuning.best import TrialRecord, choose_best, is_better

ROUNDS = 3


def _trial(trial_id, objective, rounds=ROUNDS, diverged=False):
  history = [{"round": r, TEST_ACCURACY: 0.5, "objective": objective,
              "diverged": int(diverged and r == rounds)} for r in range(1, rounds + 1)]
  return TrialRecord("fedavg", trial_id, "TERMINATED", {}, history)


def _ids(trials, **kwargs):
  best, complete = choose_best(trials, rounds=ROUNDS, **kwargs)
  return (best.trial_id if best else None), complete


def test_mode_decides_the_direction():
  trials = [_trial("a", 0.5), _trial("b", 0.7), _trial("c", 0.6)]
  assert _ids(trials, mode="max") == ("b", True)
  assert _ids(trials, mode="min") == ("a", True)


def test_diverged_and_non_finite_trials_never_win():
  trials = [_trial("d", 0.99, diverged=True), _trial("n", math.nan), _trial("i", math.inf),
            _trial("ok", 0.1)]
  assert _ids(trials, mode="max") == ("ok", True)
  assert _ids([_trial("low", -math.inf), _trial("ok", 2.0)], mode="min") == ("ok", True)


def test_a_complete_trial_beats_a_better_early_stopped_one():
  early, full = _trial("early", 0.9, rounds=1), _trial("full", 0.4)
  assert _ids([early, full], mode="max") == ("full", True)
  # No trial ran the whole budget: the best early one, flagged incomplete ...
  assert _ids([early, _trial("e2", 0.3, rounds=2)], mode="max") == ("early", False)
  assert _ids([], mode="max") == (None, False)


def test_first_of_equal_trials_wins():
  trials = [_trial("x", 0.5), _trial("y", 0.5), TrialRecord("fedavg", "z", "ERROR", {}, [])]
  assert _ids(trials, mode="max") == ("x", True)
  assert _ids(trials, mode="min") == ("x", True)


def test_is_better_names_a_wrong_mode():
  assert is_better(1.0, None, "min") and is_better(1.0, 2.0, "min")
  assert not is_better(1.0, 2.0, "max")
  with pytest.raises(ValueError, match="mode"):
    is_better(1.0, 2.0, "maximum")
