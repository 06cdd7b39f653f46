"""What a trial tells Tune after each evaluation (`eval_result`), and the run
generator its `step` advances (`iter_experiment`)."""

import functools
import math
import os
import types

from tests.helpers import tiny_base
from tff_fedadamom.metric_names import ROUND, TEST_ACCURACY
from tff_fedadamom.experiment import iter_experiment, run_experiment
from tuning.trainable import DIVERGED, NODE_ID, OBJECTIVE, eval_result, trial_environ


def test_a_run_steps_round_by_round_and_stops_where_it_is_closed(tmp_path):
  """`iter_experiment` yields each round after its hooks (its metrics row and
  checkpoint are on disk); closed early, the run stops there and a later run
  resumes from its checkpoint to the same numbers as one uninterrupted run."""
  from tff_fedadamom.experiment import outputs

  raw = {**tiny_base(rounds=4, eval_every=1, checkpoint_every=1),
         "output_dir": str(tmp_path / "stepped")}
  steps = iter_experiment(raw, progress=False)
  first = next(steps)
  assert first.round_num == 1 and first.evaluated and first.checkpoint_saved
  assert [int(r[ROUND]) for r in outputs.read_metrics(raw["output_dir"])] == [1]
  assert next(steps).round_num == 2
  steps.close()  # as a trial's reset or end does
  assert not os.path.exists(os.path.join(raw["output_dir"], outputs.SUMMARY_FILE))
  resumed = run_experiment(raw, progress=False).summary
  whole = run_experiment({**raw, "output_dir": str(tmp_path / "whole")}, progress=False).summary
  assert resumed["resumed_from_round"] == 2
  assert resumed["final_test_accuracy"] == whole["final_test_accuracy"]


def test_a_trial_runs_kernels_on_one_thread_and_sees_gpus_only_when_given():
  cpu = trial_environ(3, gpus=False)
  assert cpu["TF_NUM_INTRAOP_THREADS"] == "1" and cpu["TF_NUM_INTEROP_THREADS"] == "3"
  assert cpu["CUDA_VISIBLE_DEVICES"] == ""  # kept off the node's GPUs
  assert "CUDA_VISIBLE_DEVICES" not in trial_environ(2, gpus=True)  # as Ray set them


def test_a_run_reports_each_evaluation_with_its_objective_and_checkpoint(tmp_path):
  out = str(tmp_path / "run")
  metric = types.SimpleNamespace(name=TEST_ACCURACY, last_k=2, mode="max")
  reports = []
  make_result = functools.partial(eval_result, metric=metric, node_id="node",
                                  checkpoint_rounds={2, 3})
  run_experiment({**tiny_base(rounds=3, eval_every=2, checkpoint_every=3), "output_dir": out},
                 on_eval=lambda event: reports.append(make_result(event)), progress=False)
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
                 on_eval=lambda event: reports.append(make_result(event)), progress=False,
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
