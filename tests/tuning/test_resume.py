"""An interrupted sweep continues with resume=True (`tune --resume`): trials that
finished are not run again, the unfinished one continues, the missing ones run.
The sweeps share one local Ray (`shared_ray`)."""

import os
import signal

from ray import tune

from tests.helpers import tiny_base
from tests.tuning.conftest import rounds_reported_again, write_sweep
from tuning import joint, load_sweep, run_sweep
from tuning import space as space_lib
from tuning.export import read_trials


class InterruptOnce(tune.Callback):
  """Presses Ctrl-C (SIGINT to the driver) at the first round-1 report after a
  trial has completed: one trial finished, one caught between checkpoints (a
  trial without ASHA checkpoints at its last round only).

  Tune pickles callbacks into the experiment and restores them on resume, so
  'once' is kept in a file, not in the object."""

  def __init__(self, marker: str):
    self.marker = marker

  def on_trial_result(self, iteration, trials, trial, result, **info):
    if (result.get("round") == 1 and any(t.status == "TERMINATED" for t in trials)
        and not os.path.exists(self.marker)):
      open(self.marker, "w").close()
      os.kill(os.getpid(), signal.SIGINT)


def _rows(trial_dir):
  with open(os.path.join(trial_dir, "result.json")) as f:
    return [line for line in f if line.strip()]


def test_resume_does_not_rerun_finished_trials(tmp_path, shared_ray, no_leftover_workers):
  path = write_sweep(tmp_path, {
      "name": "resume",
      "base": tiny_base(),
      "optimizers": ["fedavg"],
      "budget": {"trials_per_optimizer": 3, "rounds": 3},
      "space": {"client.learning_rate": None},
      "search": {"kind": "random", "seed": 3},
      "resources": {"max_concurrent_trials": 2, "storage_path": str(tmp_path / "sweeps")},
  })
  first = run_sweep(path, callbacks=[InterruptOnce(str(tmp_path / "interrupted"))],
                    progress_interval_s=60)
  assert first.interrupted and first.export is None
  grid = first.results["fedavg"]
  finished = {r.metrics["trial_id"]: r.metrics["pid"] for r in grid
              if r.metrics.get("done")}
  assert finished, "no trial finished before the interruption"
  experiment = os.path.join(first.sweep_dir, joint.EXPERIMENT)
  assert os.path.isdir(experiment)
  rows_before = {t: _rows(os.path.join(experiment, f"trial_{t}")) for t in finished}

  second = run_sweep(path, resume=True, progress_interval_s=60)
  assert not second.interrupted
  grid = second.results["fedavg"]
  assert len(grid) == 3 and grid.num_terminated == 3 and not grid.errors
  by_id = {r.metrics["trial_id"]: r for r in grid}
  assert set(finished) <= set(by_id)
  for trial_id, pid in finished.items():
    # Same process as before and not a single new report: it did not run again.
    assert by_id[trial_id].metrics["pid"] == pid
    assert _rows(os.path.join(experiment, f"trial_{trial_id}")) == rows_before[trial_id]
  for result in grid:
    assert result.metrics["round"] == 3
  # The trial the interruption caught before its only checkpoint (its last
  # round) starts again from round 1; Tune then starts its result file afresh.
  # A round reported twice has the same values; the export has each round once.
  rounds_reported_again(grid)
  records = read_trials(second.sweep_dir, "fedavg")
  assert [[h["round"] for h in r.history] for r in records] == [[1, 2, 3]] * 3
  assert set(second.export.best) == {"fedavg"}
  # The trials the sweep planned (tuning.joint).
  planned = sorted(sorted(p.items()) for p in space_lib.sample_trials(load_sweep(path), "fedavg"))
  ran = sorted(sorted(r.params.items()) for r in read_trials(second.sweep_dir, "fedavg"))
  assert ran == planned and len({str(p) for p in planned}) == 3
