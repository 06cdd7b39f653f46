"""`run_sweep`: every optimizer tuned with the same budget, in one Ray Tune experiment.

One `Tuner` runs every optimizer's trials (`tuning.joint` says how the budget
stays equal), as `trainable.SweepTrial`s in actors Tune reuses (`reuse_actors`).

Layout of a sweep directory (`<resources.storage_path>/<name>`):
    sweep.yaml          the validated sweep, base experiment inlined
    trials/             the Tune experiment (trial dirs, checkpoints, searcher state)
    best/<opt>.yaml     exported best configs        (see tuning.export)
    leaderboard.csv/md, trials.csv, export.json, plots/
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import sys
import time
from concurrent import futures
from typing import Any, Mapping, Sequence

from ray import tune

from tff_fedadamom.metric_names import ROUND
from tff_fedadamom.config.loader import first_difference
from tff_fedadamom.experiment.hooks import evaluation_rounds
from tuning import joint
from tuning import schema
from tuning import space as space_lib
from tuning import trainable as trainable_lib
from tuning.errors import SweepError
from tuning.export import export_sweep
# SweepProgress is imported here too: Tune pickles callbacks into an experiment,
# and experiments saved before it moved to tuning.progress name it tuning.sweep's.
from tuning.progress import LIVE, OptimizerState, SweepProgress, SweepState, print_progress
from tuning.schema import SWEEP_FILE, Sweep

__all__ = ["SWEEP_FILE", "SweepError", "SweepProgress", "SweepResult", "asha_milestones",
           "checkpoint_rounds", "run_sweep", "smoke_test_sweep"]

@dataclasses.dataclass(frozen=True)
class SweepResult:
  """What `run_sweep` returns: the sweep that ran (after `--smoke-test`
  shrinking), its directory, optimizer -> its `tuning.joint.OptimizerResults`,
  whether it was interrupted (resume with `resume=True`), and the
  `tuning.export.ExportResult` (None when interrupted)."""

  sweep: Sweep
  sweep_dir: str
  results: Mapping[str, Any]
  interrupted: bool
  export: Any = None


# Warnings a sweep expects, filtered on their loggers while it runs only: Tune's
# note that it snapshots its state often (checkpoints close together, as at
# ASHA's first rungs), and tensorboardX's on the NaN metrics of diverged trials.
EXPECTED_WARNINGS = {
    "ray.tune.execution.experiment_state":
        lambda record: "snapshotting has been triggered" not in record.getMessage(),
    "tensorboardX.x2num": lambda record: record.levelno >= logging.ERROR,
}


@contextlib.contextmanager
def expected_warnings_silenced():
  """Filters `EXPECTED_WARNINGS` out for the duration of the block."""
  filters = [(logging.getLogger(name), keep) for name, keep in EXPECTED_WARNINGS.items()]
  for emitter, keep in filters:
    emitter.addFilter(keep)
  try:
    yield
  finally:
    for emitter, keep in filters:
      emitter.removeFilter(keep)


def smoke_test_sweep(sweep: Sweep) -> Sweep:
  """A tiny version of `sweep` that checks the whole path in a few minutes:
  one trial per optimizer, at most 2 rounds evaluated every round, no early
  stopping, random search (grids become choices), name suffixed `-smoke`."""
  raw = schema.sweep_to_dict(sweep)
  raw["name"] = sweep.name + "-smoke"
  raw["budget"] = {"trials_per_optimizer": 1, "rounds": min(2, sweep.budget.rounds)}
  raw["base"]["eval_every"] = 1
  raw["base"]["checkpoint_every"] = 1
  raw["metric"]["last_k"] = 1
  raw["scheduler"] = {"kind": "none"}
  raw["search"]["kind"] = "random"

  def degrid(entries):
    return {k: ({**v, "dist": "choice"} if isinstance(v, dict) and v.get("dist") == "grid"
                else v) for k, v in entries.items()}

  raw["space"] = {k: (degrid(v) if k in sweep.space_by_optimizer else degrid({k: v})[k])
                  for k, v in raw["space"].items()}
  raw["resources"]["time_budget_s"] = None
  return schema.parse_sweep(raw, sweep.source + " (--smoke-test)", "")


def _comparable(raw: Mapping[str, Any]) -> dict:
  """A sweep's dict without `resources.address`, which alone may change on resume
  (another cluster, or locally); the rest is restored as Tune saved it."""
  out = dict(raw)
  out["resources"] = {k: v for k, v in raw["resources"].items() if k != "address"}
  return out


def _prepare_dir(sweep: Sweep, resume: bool) -> str:
  sweep_dir = sweep.sweep_dir
  saved_path = os.path.join(sweep_dir, SWEEP_FILE)
  if resume:
    if not os.path.exists(saved_path):
      raise SweepError(f"{sweep_dir}: nothing to resume (no {SWEEP_FILE}); run without "
                       "--resume to start this sweep")
    saved = schema.sweep_to_dict(schema.load_sweep(saved_path))
    current = schema.sweep_to_dict(sweep)
    if _comparable(saved) != _comparable(current):
      field = first_difference(_comparable(saved), _comparable(current))
      raise SweepError(
          f"{sweep.source}: {field}: differs from the sweep being resumed in {sweep_dir}; "
          "only 'resources.address' may change on --resume (start a new sweep under "
          "another name to change the rest)")
    return sweep_dir
  if os.path.exists(saved_path) or os.path.isdir(os.path.join(sweep_dir, joint.EXPERIMENT)):
    raise SweepError(f"{sweep_dir} already holds sweep {sweep.name!r}; pass --resume to "
                     "continue it, or change 'name' or 'resources.storage_path'")
  os.makedirs(sweep_dir, exist_ok=True)
  schema.dump_sweep(sweep, saved_path)
  return sweep_dir


def _searcher(sweep: Sweep):
  """Random or grid: Tune's variant generator over the fixed trials (it limits
  concurrency itself); Optuna: a study per optimizer."""
  if sweep.search.kind == "optuna":
    from ray.tune.search.optuna import OptunaSearch

    def study(optimizer):
      space = space_lib.tune_space(space_lib.resolve(sweep, optimizer))
      return OptunaSearch(space=OptunaSearch.convert_search_space(space),
                          metric=trainable_lib.OBJECTIVE, mode=sweep.metric.mode,
                          seed=sweep.search.seed)

    return joint.PerOptimizerSearch(study, sweep.optimizers, sweep.budget.trials_per_optimizer)
  from ray.tune.search import BasicVariantGenerator

  return BasicVariantGenerator(
      random_state=sweep.search.seed if sweep.search.kind == "random" else None,
      max_concurrent=sweep.resources.max_concurrent_trials or 0)


def asha_milestones(grace_period: int, reduction_factor: float, max_t: int) -> list[float]:
  """The rung milestones of Ray's `ASHAScheduler` (one bracket), in rounds:
  grace_period * reduction_factor**k for k < int(log(max_t / grace_period) /
  log(reduction_factor) + 1), in np.log's floating point as Ray computes it.
  They need not be whole rounds: ASHA records a trial at its first report past one.
  """
  import numpy as np

  count = int(np.log(max_t / grace_period) / np.log(reduction_factor) + 1)
  return [grace_period * reduction_factor ** k for k in range(count)]


def checkpoint_rounds(sweep: Sweep) -> frozenset[int]:
  """The rounds at which a trial of `sweep` hands Tune a checkpoint: the last
  round, and with ASHA, every evaluation at which ASHA records the trial in a
  rung, where it may stop it. At each report ASHA records the trial in the
  largest rung it has reached and is not yet in, one rung per report; this
  replays that. A restart reruns the rounds after the latest checkpoint.
  """
  rounds = sweep.budget.rounds
  out = {rounds}
  if sweep.scheduler.kind == "asha":
    pending = asha_milestones(sweep.scheduler.grace_period, sweep.scheduler.reduction_factor,
                              rounds)
    for round_num in evaluation_rounds(rounds, sweep.base.eval_every):
      reached = [m for m in pending if m <= round_num]
      if reached:
        pending.remove(max(reached))
        out.add(round_num)
  return frozenset(out)


def _asha(sweep: Sweep):
  from ray.tune.schedulers import ASHAScheduler

  return ASHAScheduler(time_attr=ROUND, max_t=sweep.budget.rounds,
                       grace_period=sweep.scheduler.grace_period,
                       reduction_factor=sweep.scheduler.reduction_factor)


def _scheduler(sweep: Sweep):
  """One ASHA per optimizer, or none; either way the newest pending trial
  starts first (`joint.NewestPendingFirst`)."""
  if sweep.scheduler.kind == "none":
    return joint.NewestPendingFirst()
  return joint.PerOptimizerScheduler(functools.partial(_asha, sweep), sweep.optimizers)


def _trainable(sweep: Sweep):
  resources = {"cpu": sweep.resources.cpus_per_trial}
  if sweep.resources.gpus_per_trial:
    resources["gpu"] = sweep.resources.gpus_per_trial
  return tune.with_resources(
      tune.with_parameters(trainable_lib.SweepTrial, sweep=sweep,
                           checkpoint_rounds=checkpoint_rounds(sweep)),
      resources)


def _trial_dirname(trial) -> str:
  return f"trial_{trial.trial_id}"


def new_tuner(sweep: Sweep, sweep_dir: str, callbacks: Sequence[Any] = (),
              reuse_actors: bool = True):
  """The sweep's Tuner: every optimizer's trials in one experiment."""
  optuna = sweep.search.kind == "optuna"
  tune_config = tune.TuneConfig(
      metric=trainable_lib.OBJECTIVE, mode=sweep.metric.mode,
      search_alg=_searcher(sweep), scheduler=_scheduler(sweep),
      # Random and grid: one grid point per fully specified trial (`joint`).
      num_samples=sweep.budget.trials_per_optimizer * len(sweep.optimizers) if optuna else 1,
      max_concurrent_trials=sweep.resources.max_concurrent_trials if optuna else None,
      time_budget_s=sweep.resources.time_budget_s, reuse_actors=reuse_actors,
      trial_dirname_creator=_trial_dirname)
  run_config = tune.RunConfig(
      name=joint.EXPERIMENT, storage_path=sweep_dir, verbose=0, callbacks=list(callbacks),
      failure_config=tune.FailureConfig(max_failures=sweep.resources.max_failures),
      checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
  return tune.Tuner(_trainable(sweep), param_space=None if optuna else joint.param_space(sweep),
                    tune_config=tune_config, run_config=run_config)


def _saved_statuses(experiment_dir: str) -> dict[str, str]:
  """Trial path -> status, from the experiment state Tune saved on disk: after
  Ctrl-C the `ResultGrid` shows the stopped trials as terminated, the saved
  state (what `Tuner.restore` resumes) as running or pending."""
  return {t.path: t.status for t in tune.ExperimentAnalysis(experiment_dir).trials}


def run_sweep(sweep, *, resume: bool = False, smoke_test: bool = False,
              callbacks: Sequence[Any] = (), progress_interval_s: float = 30.0,
              export: bool = True, stream=None, reuse_actors: bool = True) -> SweepResult:
  """Runs (or resumes) a sweep (a YAML path, mapping, or `Sweep`) and exports it.

  Args:
    resume: Continue the sweep in its directory with `Tuner.restore`: finished
      trials are kept, unfinished ones continue from their last checkpoint,
      and the searcher proposes only the trials still missing.
    smoke_test: Run `smoke_test_sweep(sweep)` instead.
    callbacks: Extra Tune callbacks; Tune saves them with the experiment, so a
      resumed experiment runs with those it started with.
    progress_interval_s: Seconds between progress tables (0: every step).
    export: Export at the end (in a thread, while the Ray session ends).
    reuse_actors: Run trial after trial in the same actors, which keep their
      imports and built parts; the results are the same either way.

  Raises SweepConfigError for an invalid sweep file (nothing has run), and
  SweepError if the directory holds another sweep or there is nothing to resume.
  """
  from tff_fedadamom.runtime.ray_session import ray_session

  sweep = schema.load_sweep(sweep)
  if smoke_test:
    sweep = smoke_test_sweep(sweep)
  sweep_dir = _prepare_dir(sweep, resume)
  out = stream or sys.stdout
  state = SweepState(
      sweep=sweep, started=time.monotonic(), stream=stream,
      per_optimizer={o: OptimizerState(total=sweep.budget.trials_per_optimizer)
                     for o in sweep.optimizers})
  LIVE[sweep_dir] = state
  experiment_dir = os.path.join(sweep_dir, joint.EXPERIMENT)
  results, interrupted, exporting = {}, False, None
  try:
    with futures.ThreadPoolExecutor(1) as background, expected_warnings_silenced(), \
        ray_session(sweep.resources.address):
      if resume and tune.Tuner.can_restore(experiment_dir):
        tuner = tune.Tuner.restore(experiment_dir, trainable=_trainable(sweep),
                                   resume_unfinished=True, resume_errored=True)
      else:
        progress = SweepProgress(sweep_dir, progress_interval_s)
        tuner = new_tuner(sweep, sweep_dir, [progress, *callbacks], reuse_actors)
      grid = tuner.fit()
      statuses = _saved_statuses(experiment_dir)
      results = joint.by_optimizer(grid, sweep.optimizers, statuses)
      print_progress(state)
      for name, trials in results.items():
        for error in trials.errors:
          lines = str(error).strip().splitlines()
          print(f"   {name}: a trial failed: {lines[-1] if lines else error!r}",
                file=out, flush=True)
      if any(status not in ("TERMINATED", "ERROR") for status in statuses.values()):
        interrupted = True
        print(f"sweep interrupted; continue it with --resume ({sweep_dir})", file=out,
              flush=True)
      elif export:  # from Tune's files, while Ray ends
        exporting = background.submit(export_sweep, sweep_dir)
  finally:
    LIVE.pop(sweep_dir, None)
  exported = exporting.result() if exporting is not None else None
  if exported is not None:
    print(exported.leaderboard_markdown, file=out, flush=True)
  return SweepResult(sweep=sweep, sweep_dir=sweep_dir, results=results,
                     interrupted=interrupted, export=exported)
