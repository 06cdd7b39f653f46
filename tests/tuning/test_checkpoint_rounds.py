"""The rounds at which a trial hands Tune a checkpoint (`tuning.sweep.checkpoint_rounds`):
ASHA's rungs as Ray's own scheduler has them, and the last round."""

import types

import pytest
from ray.tune.schedulers import ASHAScheduler

from tests.helpers import tiny_base
from tuning import schema
from tuning.sweep import asha_milestones, checkpoint_rounds

# (grace_period, reduction_factor, max_t): integer and non-integer factors, a
# grace period above 1, and max_t on a milestone (1000 = 10**3 is one in exact
# arithmetic; Ray's floating-point count decides whether it is kept).
CASES = [(1, 2, 8), (1, 2, 100), (10, 2, 100), (1, 3, 27), (1, 10, 1000), (3, 4, 50),
         (2, 1.5, 20), (1, 1.2, 10), (5, 2, 5), (4, 3, 100)]


@pytest.mark.parametrize("grace, rf, max_t", CASES)
def test_milestones_are_those_of_rays_asha(grace, rf, max_t):
  scheduler = ASHAScheduler(time_attr="round", max_t=max_t, grace_period=grace,
                            reduction_factor=rf)
  (bracket,) = scheduler._brackets  # private: Ray keeps its rungs largest first
  expected = sorted(milestone for milestone, _ in bracket._rungs)
  assert asha_milestones(grace, rf, max_t) == expected


def _sweep(rounds, eval_every, scheduler):
  return schema.parse_sweep({
      "name": "rungs", "base": tiny_base(eval_every=eval_every), "optimizers": ["fedavg"],
      "budget": {"trials_per_optimizer": 2, "rounds": rounds},
      "space": {"client.learning_rate": None}, "scheduler": scheduler})


def test_checkpoint_rounds_by_hand():
  asha = lambda grace, rf: {"kind": "asha", "grace_period": grace,  # noqa: E731
                            "reduction_factor": rf}
  # Rungs 1, 2, 4, 8 met at the evaluations of those rounds; the last round.
  assert checkpoint_rounds(_sweep(8, 1, asha(1, 2))) == {1, 2, 4, 8}
  assert checkpoint_rounds(_sweep(20, 1, asha(1, 2))) == {1, 2, 4, 8, 16, 20}
  # Evaluations every 3 rounds (and at round 10): rungs 1, 2 are met at 3, 4 at
  # 6, 8 at 9.
  assert checkpoint_rounds(_sweep(10, 3, asha(1, 2))) == {3, 6, 9, 10}
  # Every 3 rounds to 20: round 3 meets rungs 1 and 2 and ASHA records the
  # trial at rung 2; it records it at rung 1 at its next report with no new
  # rung, round 12.
  assert checkpoint_rounds(_sweep(20, 3, asha(1, 2))) == {3, 6, 9, 12, 18, 20}
  # Milestones 2, 3, 4.5, 6.75: met at rounds 2, 3, 5, 7.
  assert checkpoint_rounds(_sweep(10, 1, asha(2, 1.5))) == {2, 3, 5, 7, 10}
  assert checkpoint_rounds(_sweep(10, 1, {"kind": "none"})) == {10}
  assert checkpoint_rounds(_sweep(10, 4, {"kind": "none"})) == {10}


@pytest.mark.parametrize("grace, rf, rounds, eval_every",
                         [(1, 2, 8, 1), (1, 2, 20, 3), (2, 1.5, 20, 1), (1, 1.2, 10, 1),
                          (3, 4, 50, 5), (4, 3, 100, 7), (1, 3, 27, 2)])
def test_checkpoint_rounds_are_where_asha_decides(grace, rf, rounds, eval_every):
  """A real ASHA fed one trial's reports (every evaluation round) records the
  trial in a rung exactly at the checkpoint rounds before the last (where it
  stops every trial)."""
  scheduler = ASHAScheduler(time_attr="round", metric="objective", mode="max",
                            max_t=rounds, grace_period=grace, reduction_factor=rf)
  trial = types.SimpleNamespace(trial_id="t")
  scheduler.on_trial_add(None, trial)
  (bracket,) = scheduler._brackets
  decided, recorded = set(), 0
  evaluations = [r for r in range(1, rounds + 1) if r % eval_every == 0 or r == rounds]
  for round_num in evaluations:
    scheduler.on_trial_result(None, trial, {"round": round_num, "objective": 0.5})
    now = sum("t" in rung for _, rung in bracket._rungs)
    if now > recorded:
      decided.add(round_num)
    recorded = now
  sweep = _sweep(rounds, eval_every, {"kind": "asha", "grace_period": grace,
                                      "reduction_factor": rf})
  assert checkpoint_rounds(sweep) == decided | {rounds}
