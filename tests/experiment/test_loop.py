"""The round loop and its hooks, on a stand-in process whose every value is known."""

import math

import numpy as np
import pytest

from tests.helpers import CountingProcess, evaluator, sampler
from tff_fedadamom.metric_names import NONFINITE_UPDATES, ROUND, TEST_ACCURACY, TRAIN_ACCURACY
from tff_fedadamom.metric_names import TRAIN_LOSS, TRAIN_NUM_EXAMPLES
from tff_fedadamom.experiment import hooks
from tff_fedadamom.experiment.loop import RoundHook, run_rounds

# What every round's metrics start with (`flatten_round_metrics`).
ROUND_METRICS = [ROUND, TRAIN_LOSS, TRAIN_ACCURACY, TRAIN_NUM_EXAMPLES, NONFINITE_UPDATES]


class Recorder(RoundHook):
  """Logs every call into a shared list; adds the metric `name` each round."""

  def __init__(self, name, log):
    self.name, self.log = name, log

  def start_round(self, round_num, state):
    self.log.append(("start", self.name, round_num, state))

  def end_round(self, end):
    self.log.append(("end", self.name, end.round_num, sorted(end.metrics)))
    end.metrics[self.name] = float(end.round_num)

  def close(self):
    self.log.append(("close", self.name))


class FakeStateManager:
  def __init__(self):
    self.saved = []

  async def save(self, flat, version):
    self.saved.append((version, list(flat)))


class FakeReleaseManager:
  def __init__(self):
    self.released = []

  async def release(self, value, key):
    self.released.append((key, dict(value)))


def test_hooks_run_in_order_around_each_round_and_close_once():
  log = []
  process = CountingProcess()
  result = run_rounds(process, 0.0, range(1, 3), sampler,
                      [Recorder("a", log), Recorder("b", log)])
  base = sorted(ROUND_METRICS)
  assert log == [
      ("start", "a", 1, 0.0), ("start", "b", 1, 0.0),
      ("end", "a", 1, base), ("end", "b", 1, sorted(base + ["a"])),
      ("start", "a", 2, 1.0), ("start", "b", 2, 1.0),
      ("end", "a", 2, base), ("end", "b", 2, sorted(base + ["a"])),
      ("close", "a"), ("close", "b"),
  ]
  assert process.clients_seen == [sampler(1), sampler(2)]
  assert (result.state, result.rounds_run, result.diverged_round) == (2.0, 2, None)


def test_a_resumed_loop_samples_its_own_rounds_and_knows_its_last():
  process = CountingProcess()
  lasts = []

  class Last(RoundHook):
    def end_round(self, end):
      lasts.append((end.round_num, end.last, end.final))

  result = run_rounds(process, 5.0, range(6, 9), sampler, [Last()])
  assert process.clients_seen == [sampler(6), sampler(7), sampler(8)]
  assert lasts == [(6, False, False), (7, False, False), (8, True, True)]
  assert result.state == 8.0 and result.rounds_run == 3


def test_each_round_is_next_for_clients_of_state_clients_and_round():
  process = CountingProcess()
  result = run_rounds(process, 1.0, [3, 4], sampler)
  assert process.calls == [(1.0, sampler(3), 3), (2.0, sampler(4), 4)]
  assert result.state == 3.0


def test_a_nan_loss_stops_the_loop_after_its_round_is_evaluated_and_saved():
  process = CountingProcess(losses={2: math.nan})
  manager, log = FakeStateManager(), []
  result = run_rounds(process, 0.0, range(1, 6), sampler,
                      [hooks.Divergence(patience=3), hooks.Evaluate(evaluator, every=4),
                       hooks.Checkpoint(manager, every=4), Recorder("after", log)])
  assert result.diverged_round == 2 and result.rounds_run == 2
  assert len(process.clients_seen) == 2  # round 3 never ran
  # Round 2 is the run's final round: evaluated and saved although 2 % 4 != 0.
  assert [entry[3] for entry in log if entry[0] == "end"] == [
      sorted(ROUND_METRICS), sorted(ROUND_METRICS + [TEST_ACCURACY])]
  assert manager.saved == [(2, [2.0])]
  assert log[-1] == ("close", "after")


def test_non_finite_weights_diverge_with_a_finite_loss():
  process = CountingProcess(nan_from=3)
  result = run_rounds(process, 0.0, range(1, 6), sampler, [hooks.Divergence(patience=3)])
  assert result.diverged_round == 3 and math.isnan(result.state)


def test_rejected_updates_diverge_after_patience_in_a_row():
  # Rejected in rounds 1, 3, 4, 5: the streak is 1, 0, 1, 2, 3 -> diverged at 5.
  process = CountingProcess(rejected={1, 3, 4, 5})
  result = run_rounds(process, 0.0, range(1, 9), sampler, [hooks.Divergence(patience=3)])
  assert result.diverged_round == 5 and result.rounds_run == 5


def test_hooks_share_one_fetch_of_the_weights_per_round():
  process = CountingProcess()

  class Reads(RoundHook):
    def end_round(self, end):
      assert end.weights == [np.float32(end.state)]

  run_rounds(process, 0.0, range(1, 4), sampler, [hooks.Divergence(5), Reads(), Reads()])
  assert process.weight_fetches == 3


class FailingProcess(CountingProcess):
  def next_for_clients(self, state, clients, round_num):
    if round_num == 2:
      raise RuntimeError("round 2 failed")
    return super().next_for_clients(state, clients, round_num)


def test_hooks_are_closed_when_a_round_fails():
  log = []
  with pytest.raises(RuntimeError, match="round 2 failed"):
    run_rounds(FailingProcess(), 0.0, range(1, 4), sampler, [Recorder("a", log)])
  assert [e[:3] for e in log] == [("start", "a", 1), ("end", "a", 1), ("start", "a", 2),
                                  ("close", "a")]


def test_release_checkpoint_and_callbacks_see_each_round_as_written():
  process = CountingProcess()
  csv, tb, manager = FakeReleaseManager(), FakeReleaseManager(), FakeStateManager()
  rounds_seen, events = [], []
  run_rounds(process, 0.0, range(1, 6), sampler, [
      hooks.Divergence(3), hooks.Evaluate(evaluator, every=2), hooks.ElapsedTime(0.0),
      hooks.Release([csv, tb]), hooks.Checkpoint(manager, every=3),
      hooks.OnRound(lambda r, m: rounds_seen.append((r, m[TRAIN_LOSS]))),
      hooks.OnEval(events.append, "/runs/x")])
  assert [key for key, _ in csv.released] == [1, 2, 3, 4, 5]
  assert csv.released == tb.released
  assert all(ROUND not in value and value["time/elapsed_s"] > 0 for _, value in csv.released)
  assert [v.get(TEST_ACCURACY) for _, v in csv.released] == [None, 0.2, None, 0.4, 0.5]
  assert [version for version, _ in manager.saved] == [3, 5]  # every 3rd, and the last
  assert rounds_seen == [(r, 1.0) for r in range(1, 6)]
  assert [(e.round_num, e.metrics[TEST_ACCURACY], e.checkpoint_saved, e.diverged,
           e.output_dir) for e in events] == [(2, 0.2, False, False, "/runs/x"),
                                             (4, 0.4, False, False, "/runs/x"),
                                             (5, 0.5, True, False, "/runs/x")]


@pytest.mark.parametrize("rounds, saved", [({2, 3}, [2, 3, 6]), ({6}, [6]), ((), [6])])
def test_a_checkpoint_at_given_rounds_saves_there_and_at_the_end_only(rounds, saved):
  """With `rounds` (a sweep trial's: where Tune takes its checkpoints) the state
  is saved at those rounds and the final one, not every `every` rounds; a
  divergence ends the run, and is saved, wherever it comes."""
  manager, events = FakeStateManager(), []
  run_rounds(CountingProcess(), 0.0, range(1, 7), sampler, [
      hooks.Evaluate(evaluator, every=1), hooks.Checkpoint(manager, every=1, rounds=rounds),
      hooks.OnEval(events.append, "/runs/x")])
  assert [version for version, _ in manager.saved] == saved
  assert [e.round_num for e in events if e.checkpoint_saved] == saved
  diverging, manager = CountingProcess(losses={4: math.nan}), FakeStateManager()
  run_rounds(diverging, 0.0, range(1, 7), sampler,
             [hooks.Divergence(patience=1), hooks.Checkpoint(manager, every=1, rounds=rounds)])
  assert [version for version, _ in manager.saved] == [r for r in saved if r < 4] + [4]


def test_a_runs_release_calls_run_in_the_calling_thread():
  """`asyncio.run` per call starts a loop and an executor thread each time (what
  made a long run's memory grow); the run's `EventLoop` keeps one loop and does
  the managers' executor work in the thread that calls it (no arena of its own)."""
  import asyncio
  import threading

  from tff_fedadamom.experiment.loop import RoundEnd

  def threads_used(run_async):
    seen = set()

    class Manager:
      async def release(self, value, key):
        del value, key
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: seen.add(threading.current_thread()))

    hook = hooks.Release([Manager(), Manager()], run_async)
    for r in range(1, 6):
      hook.end_round(RoundEnd(r, None, {ROUND: r}, [], r == 5, None))
    return seen

  loop = hooks.EventLoop()
  try:
    assert threads_used(loop) == {threading.current_thread()}
  finally:
    loop.close()
  loop.close()  # closing twice is harmless
  assert len(threads_used(asyncio.run)) == 10  # what the runner no longer does


@pytest.mark.parametrize("rounds, every", [(6, 2), (7, 3), (5, 5), (3, 4), (1, 1)])
def test_evaluation_rounds_are_the_rounds_evaluate_evaluates(rounds, every):
  """`hooks.evaluation_rounds` (what sweeps and benchmarks plan with) against
  the rounds `Evaluate` evaluated in a run that reached its end."""
  evaluated = []
  run_rounds(CountingProcess(), 0.0, range(1, rounds + 1), sampler,
             [hooks.Evaluate(evaluator, every), hooks.OnRound(
                 lambda r, m: evaluated.append(r) if TEST_ACCURACY in m else None)])
  assert hooks.evaluation_rounds(rounds, every) == evaluated
