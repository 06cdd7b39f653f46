"""What Ray Tune alone costs a sweep: the sweep's reports replayed with no work.

A sweep's speed-up over a shell loop of separate runs is bounded by what Tune
itself spends on the sweep's trials: its controller's start, a trial actor per
slot, each trial's start and end, each report, each checkpoint and the
experiment state it writes. Here the same Tuner that `tuning.run_sweep` builds
(`tuning.sweep.new_tuner`: the same trials, scheduler, resources and run
config) runs a trainable that does nothing but report: each trial replays the
results a real sweep's trial reported (its round and objective, so ASHA stops
the same trials at the same rungs), with a one-file checkpoint on the rounds
where the real trial's report carried one (`tuning.sweep.checkpoint_rounds`).
Its wall time is the floor of any sweep of these trials through Tune, on this
machine; the shell loop's time over it is the highest speed-up such a sweep
could show.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from tff_fedadamom.metric_names import ROUND


def trial_key(config: dict) -> str:
  """The identity of a trial's Tune config (every trial of a random or grid
  sweep is fully specified, `tuning.joint`)."""
  return json.dumps(config, sort_keys=True, default=str)


def reports(result_grid_items) -> dict[str, list[dict]]:
  """Trial key -> the (round, objective) reports of each trial of a finished
  sweep (`ResultGrid` items, any optimizer)."""
  from tuning.trainable import OBJECTIVE

  table = {}
  for result in result_grid_items:
    frame = result.metrics_dataframe
    rows = [] if frame is None else frame[[ROUND, OBJECTIVE]].to_dict("records")
    table[trial_key(result.config)] = [
        {ROUND: int(row[ROUND]), OBJECTIVE: float(row[OBJECTIVE])} for row in rows]
  return table


def replay(config: dict, *, table: dict, checkpoint_rounds) -> None:
  """A trainable that reports what the trial `config` reported, and nothing else."""
  from ray import tune

  for row in table[trial_key(config)]:
    if row[ROUND] in checkpoint_rounds:
      with tempfile.TemporaryDirectory(prefix="tune-floor-") as directory:
        with open(os.path.join(directory, "round"), "w") as f:
          f.write(str(row[ROUND]))
        tune.report(row, checkpoint=tune.Checkpoint.from_directory(directory))
    else:
      tune.report(row)


def replayed_sweep_s(sweep, table: dict, storage: str) -> tuple[float, int]:
  """(wall seconds, reports made) of the joint Tuner of `sweep` (a loaded
  `Sweep`), as `run_sweep` builds it, in the Ray session already running,
  whose trials replay `table` (`reports`). ASHA decides as reports arrive, so
  a replay may stop a trial a rung earlier or later than the sweep it replays:
  compare the report counts."""
  import ray.cloudpickle
  from ray import tune

  from tuning import sweep as sweep_lib

  # The trial actors import `tuning`, not this file: they get it by value.
  ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
  trainable = tune.with_resources(
      tune.with_parameters(replay, table=table,
                           checkpoint_rounds=sweep_lib.checkpoint_rounds(sweep)),
      {"cpu": sweep.resources.cpus_per_trial})
  with sweep_lib.expected_warnings_silenced():
    tuner = sweep_lib.new_tuner(sweep, None, storage, [], pool=None, trainable=trainable)
    start = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - start
  errors = sum(r.error is not None for r in grid)
  if errors or len(grid) != len(table):
    raise RuntimeError(f"the replay ran {len(grid)} trials of {len(table)}, {errors} errored")
  return wall, sum(0 if r.metrics_dataframe is None else len(r.metrics_dataframe) for r in grid)
