"""The trainable's report hook: what a trial tells Tune after each evaluation."""

import functools
import math
import types

from tests.experiment.test_loop import CountingProcess, evaluator, sampler
from tests.tuning.conftest import tiny_base
from tff_fedadamom.metric_names import ROUND, TEST_ACCURACY
from tff_fedadamom.experiment import hooks, run_experiment
from tff_fedadamom.experiment.loop import run_rounds
from tuning.trainable import DIVERGED, NODE_ID, OBJECTIVE, TuneReport, eval_result


def test_tune_report_reports_evaluated_rounds_only():
  reports = []
  report = TuneReport("/runs/t", lambda event: ("result", event), reports.append)
  run_rounds(CountingProcess(losses={5: math.nan}), 0.0, range(1, 9), sampler,
             [hooks.Divergence(3), hooks.Evaluate(evaluator, every=2), report])
  events = [event for _, event in reports]
  assert [(e.round_num, e.diverged, e.output_dir) for e in events] == [
      (2, False, "/runs/t"), (4, False, "/runs/t"), (5, True, "/runs/t")]
  assert [e.metrics[TEST_ACCURACY] for e in events] == [0.2, 0.4, 0.5]


def test_a_run_reports_each_evaluation_with_its_objective_and_checkpoint(tmp_path):
  out = str(tmp_path / "run")
  metric = types.SimpleNamespace(name=TEST_ACCURACY, last_k=2, mode="max")
  reports = []
  make_result = functools.partial(eval_result, metric=metric, node_id="node",
                                  checkpoint_rounds={2, 3})
  run_experiment({**tiny_base(rounds=3, eval_every=2, checkpoint_every=3), "output_dir": out},
                 hooks=[TuneReport(out, make_result, reports.append)], progress=False)
  results = [result for result, _ in reports]
  assert [r[ROUND] for r in results] == [2, 3]  # every 2nd round and the last
  # Round 2 is a checkpoint round, but the run saved nothing there.
  assert [checkpoint for _, checkpoint in reports] == [None, out]  # saved in round 3
  assert [r[DIVERGED] for r in results] == [0, 0]
  assert [r[NODE_ID] for r in results] == ["node", "node"]  # what the export reads
  # The objective is the mean over the last 2 evaluations: the report runs once
  # the round's metrics row is written.
  first, last = (r[TEST_ACCURACY] for r in results)
  assert results[0][OBJECTIVE] == first
  assert math.isclose(results[1][OBJECTIVE], (first + last) / 2)


def _reports(out, checkpoint_rounds, saves_at=None, **overrides):
  """(round, diverged, checkpoint) of each report of a run whose state is saved
  at `saves_at` (`run_experiment`'s `checkpoint_rounds`; None: every
  `checkpoint_every` rounds)."""
  metric = types.SimpleNamespace(name=TEST_ACCURACY, last_k=1, mode="max")
  reports = []
  make_result = functools.partial(eval_result, metric=metric, node_id="node",
                                  checkpoint_rounds=checkpoint_rounds)
  run_experiment({**tiny_base(**overrides), "output_dir": out},
                 hooks=[TuneReport(out, make_result, reports.append)], progress=False,
                 checkpoint_rounds=saves_at)
  return [(result[ROUND], result[DIVERGED], checkpoint) for result, checkpoint in reports]


def test_only_checkpoint_rounds_and_a_diverged_stop_hand_tune_a_checkpoint(tmp_path):
  """The run saves every round; Tune gets the run directory at the rounds
  asked for, and where a diverged run stops, whatever those rounds are."""
  out = str(tmp_path / "run")
  assert _reports(out, {2, 4}, rounds=4, eval_every=1, checkpoint_every=1) == [
      (1, 0, None), (2, 0, out), (3, 0, None), (4, 0, out)]
  out = str(tmp_path / "diverges")
  # 1e38 overflows float32 within two rounds; diverge_patience 1 stops it there.
  reports = _reports(out, {4}, rounds=4, eval_every=1, checkpoint_every=1,
                     server={"optimizer": "fedavg", "learning_rate": 1.0e+38})
  assert reports[-1] == (reports[-1][0], 1, out) and reports[-1][0] < 4
  assert all(checkpoint is None for _, _, checkpoint in reports[:-1])


def test_a_trial_run_saves_its_state_only_where_tune_takes_a_checkpoint(tmp_path):
  """With `checkpoint_rounds` the run saves at those rounds alone, not every
  `checkpoint_every` rounds: Tune keeps no other checkpoint of a trial."""
  import asyncio

  from tff_fedadamom.experiment import resume

  out = str(tmp_path / "run")
  assert _reports(out, {2, 5}, saves_at={2, 5}, rounds=5, eval_every=1,
                  checkpoint_every=1) == [(1, 0, None), (2, 0, out), (3, 0, None),
                                          (4, 0, None), (5, 0, out)]
  assert sorted(asyncio.run(resume.state_manager(out).get_versions())) == [2, 5]
