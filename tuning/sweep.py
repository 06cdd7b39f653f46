"""`run_sweep`: every optimizer tuned with the same budget, through Ray Tune.

Random and grid sweeps run as one Tune experiment for all optimizers
(`tuning.joint`): each optimizer's trials are drawn from its own space before
Tune starts (`space.sample_trials`), interleaved, and early-stopped by an ASHA of
its own, so the budget stays equal per optimizer while Tune's fixed cost is paid
once and trials of different optimizers share the slots.

Optuna sweeps run one `Tuner` per optimizer, one after the other:
  * Optuna proposes each trial from the ones before it, in one space; in a
    single Tuner it would spend trials on whichever optimizer looks best early.
  * Resume works per optimizer: a finished optimizer's experiment is restored
    with nothing left to run; an interrupted one continues where it stopped.
The cost: a Tuner's start and end per optimizer, and the last trials of each
optimizer can leave a slot idle.

Layout of a sweep directory (`<resources.storage_path>/<name>`):
    sweep.yaml          the validated sweep, base experiment inlined
    trials/             the Tune experiment of a random or grid sweep (trial
                        dirs, checkpoints, searcher state)
    <optimizer>/        one per optimizer instead, for Optuna (and for sweeps
                        started with per-optimizer experiments, kept on resume)
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
from typing import Any, Mapping, Optional, Sequence

from ray import tune

from tff_fedadamom.metric_names import ROUND
from tff_fedadamom.config.loader import first_difference
from tff_fedadamom.experiment.hooks import evaluation_rounds
from tuning import joint
from tuning import schema
from tuning import space as space_lib
from tuning import trainable as trainable_lib
from tuning import pools
from tuning.errors import SweepError
from tuning.export import export_sweep
# SweepProgress is imported here too: Tune pickles callbacks into an experiment,
# and experiments saved before it moved to tuning.progress name it tuning.sweep's.
from tuning.progress import LIVE, OptimizerState, SweepProgress, SweepState, print_progress
from tuning.schema import SWEEP_FILE, Sweep
from tuning.template import sweep_session

__all__ = ["SWEEP_FILE", "SweepError", "SweepProgress", "SweepResult", "asha_milestones",
           "checkpoint_rounds", "run_sweep", "smoke_test_sweep"]

logger = logging.getLogger("tuning")


@dataclasses.dataclass(frozen=True)
class SweepResult:
  """What `run_sweep` returns.

  Attributes:
    sweep: The sweep that ran (after `--smoke-test` shrinking, if any).
    sweep_dir: Its directory.
    results: Optimizer -> its trials' Tune results: the `ResultGrid` of its
      Tuner (Optuna), or its part of the joint experiment's
      (`tuning.joint.OptimizerResults`: len, iteration, errors, num_terminated).
    interrupted: True when the sweep stopped early (Ctrl-C; resume with `resume=True`).
    export: The `tuning.export.ExportResult`, None when interrupted.
  """

  sweep: Sweep
  sweep_dir: str
  results: Mapping[str, Any]
  interrupted: bool
  export: Any = None


# Warnings a sweep expects, silenced while it runs and only then (a filter on
# the logger that emits each, removed afterwards; no environment variable, no
# logger level changed for good): Tune's note that it snapshots its state often
# (after checkpoints close together, as at ASHA's first rungs), and
# tensorboardX's note on the NaN metrics of diverged trials.
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
  """A sweep's dict without what may change between a run and its resumption:
  only `resources.address` (resume on another cluster, or locally). Everything
  else is part of the experiment Tune saved, and is restored as saved."""
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
  if os.path.exists(saved_path) or any(
      os.path.isdir(os.path.join(sweep_dir, o)) for o in (*sweep.optimizers, joint.EXPERIMENT)):
    raise SweepError(f"{sweep_dir} already holds sweep {sweep.name!r}; pass --resume to "
                     "continue it, or change 'name' or 'resources.storage_path'")
  os.makedirs(sweep_dir, exist_ok=True)
  schema.dump_sweep(sweep, saved_path)
  return sweep_dir


def _searcher(sweep: Sweep):
  kind = sweep.search.kind
  if kind == "optuna":
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(seed=sweep.search.seed)
  from ray.tune.search import BasicVariantGenerator

  # A SearchAlgorithm, not a Searcher: it limits concurrency itself (Tune
  # ignores TuneConfig.max_concurrent_trials for it).
  return BasicVariantGenerator(
      random_state=sweep.search.seed if kind == "random" else None,
      max_concurrent=sweep.resources.max_concurrent_trials or 0)


def asha_milestones(grace_period: int, reduction_factor: float, max_t: int) -> list[float]:
  """The rung milestones of Ray's `ASHAScheduler` (one bracket), in rounds.

  grace_period * reduction_factor**k for k = 0 .. K-1, where Ray takes
  K = int(log(max_t / grace_period) / log(reduction_factor) + 1): floor of
  log_rf(max_t / grace) + 1, in floating point as Ray computes it (np.log, so
  that a milestone that lands on max_t within rounding is kept or dropped as
  Ray does). With a non-integer factor the milestones are not whole rounds
  (1, 1.5, 2.25, ...): ASHA records a trial at its first report at or past one.
  """
  import numpy as np

  count = int(np.log(max_t / grace_period) / np.log(reduction_factor) + 1)
  return [grace_period * reduction_factor ** k for k in range(count)]


def checkpoint_rounds(sweep: Sweep) -> frozenset[int]:
  """The rounds at which a trial of `sweep` hands Tune a checkpoint: the last
  round (`budget.rounds`), and with ASHA, every evaluation at which ASHA records
  the trial in a rung, the reports where it may stop it.

  A trial reports at its evaluations (every `base.eval_every` rounds and at the
  last). At each report Ray's ASHA records the trial in the largest rung it has
  reached and is not yet recorded in, and compares it there; one rung per
  report, so a rung passed over (two milestones between two evaluations) is
  recorded at a later report. Replaying that rule over the evaluation rounds
  gives the rounds. A trial ASHA stops ends with its checkpoint there; one that
  diverges checkpoints where it stops (`trainable.eval_result`). Between them
  a trial reports without one: a restart resumes from the latest checkpoint
  and runs the rounds after it again, with the same results (rounds are
  deterministic).
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


def _scheduler(sweep: Sweep, optimizer: Optional[str]):
  """The early stopping of one optimizer's Tuner, or (`optimizer` None) of the joint
  experiment: one ASHA per optimizer; without, none. Either way the newest
  pending trial starts first (`joint.NewestPendingFirst`)."""
  if sweep.scheduler.kind == "none":
    return joint.NewestPendingFirst()
  return joint.PerOptimizerScheduler(functools.partial(_asha, sweep),
                                     sweep.optimizers if optimizer is None else [optimizer])


def _trainable(sweep: Sweep, optimizer: Optional[str], pool: Optional[str]):
  resources = {"cpu": sweep.resources.cpus_per_trial}
  if sweep.resources.gpus_per_trial:
    resources["gpu"] = sweep.resources.gpus_per_trial
  return tune.with_resources(
      tune.with_parameters(trainable_lib.train_trial, sweep=sweep, optimizer=optimizer,
                           pool=pool, checkpoint_rounds=checkpoint_rounds(sweep)),
      resources)


def _trial_dirname(trial) -> str:
  return f"trial_{trial.trial_id}"


def new_tuner(sweep: Sweep, optimizer: Optional[str], sweep_dir: str, callbacks: list,
              pool: Optional[str], trainable=None):
  """The Tuner of one optimizer, or (`optimizer` None) the joint one.

  `trainable` runs instead of the sweep's trials, in actors Tune reuses as with
  a pool: Tune's own cost for these trials (`benchmarks/tune_floor.py`). It
  must report the sweep's objective and `ROUND`."""
  budget = sweep.resources.time_budget_s
  if optimizer is not None and budget:
    budget /= len(sweep.optimizers)
  if sweep.search.kind == "optuna":
    param_space = space_lib.tune_space(space_lib.resolve(sweep, optimizer))
    num_samples = sweep.budget.trials_per_optimizer
  else:
    # Every trial fully specified before Tune starts (tuning.joint): one grid
    # point each, the same trials whether the Tuner runs one optimizer or all.
    param_space = joint.param_space(sweep, None if optimizer is None else [optimizer])
    num_samples = 1
  tune_config = tune.TuneConfig(
      metric=trainable_lib.OBJECTIVE, mode=sweep.metric.mode,
      search_alg=_searcher(sweep), scheduler=_scheduler(sweep, optimizer),
      num_samples=num_samples,
      max_concurrent_trials=(sweep.resources.max_concurrent_trials
                             if sweep.search.kind == "optuna" else None),
      time_budget_s=budget,
      # With a worker pool a trial's own process only reports (it never imports
      # TensorFlow), so Tune may hand it the next trial of this Tuner. Without,
      # a trial's process holds TFF's runtime, bound to the trial's thread.
      reuse_actors=pool is not None or trainable is not None,
      trial_dirname_creator=_trial_dirname)
  run_config = tune.RunConfig(
      name=optimizer or joint.EXPERIMENT, storage_path=sweep_dir, verbose=0, callbacks=callbacks,
      failure_config=tune.FailureConfig(max_failures=sweep.resources.max_failures),
      checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
  return tune.Tuner(trainable or _trainable(sweep, optimizer, pool), param_space=param_space,
                    tune_config=tune_config, run_config=run_config)


def _saved_statuses(experiment_dir: str) -> dict[str, str]:
  """Trial path -> status, from the experiment state Tune saved on disk.

  That, not the `ResultGrid`, tells an interrupted experiment: after Ctrl-C
  Tune stops the running trials, and its in-memory results then show them as
  terminated, while the saved state (what `Tuner.restore` resumes) keeps them
  running or pending."""
  return {t.path: t.status for t in tune.ExperimentAnalysis(experiment_dir).trials}


def run_sweep(sweep, *, resume: bool = False, smoke_test: bool = False,
              callbacks: Sequence[Any] = (), progress_interval_s: float = 30.0,
              export: bool = True, stream=None, reuse_workers: bool = True,
              one_experiment: bool = True,
              pool: Optional[pools.SharedWorkerPool] = None) -> SweepResult:
  """Runs (or resumes) a sweep and exports its best configs.

  Args:
    sweep: A sweep YAML path, mapping, or `Sweep`.
    resume: Continue the sweep in its directory with `Tuner.restore`: finished
      trials are kept as they are, unfinished ones continue from their last
      checkpoint, and the searcher proposes only the trials still missing.
    smoke_test: Run `smoke_test_sweep(sweep)` instead (a quick end-to-end check).
    callbacks: Extra Tune callbacks for every Tuner. Tune saves them with the
      experiment: a resumed experiment runs with the callbacks it started with.
    progress_interval_s: Seconds between progress tables (0: every step).
    export: Export best configs, leaderboard and plots at the end (in a thread,
      from Tune's files, while the sweep's own worker pool and Ray session end).
    stream: Where progress goes (default stdout).
    reuse_workers: Run trials in long-lived workers that keep imports, data
      and built processes between trials (`tuning.workers`); False runs each
      trial in a process of its own. The results are the same either way.
    one_experiment: Run a random or grid sweep as one Tune experiment for all
      optimizers (`tuning.joint`); False runs a Tuner per optimizer, one after
      the other, as Optuna sweeps do. The trials are the same either way. A
      resumed sweep keeps the layout it started with.
    pool: A `pools.shared_worker_pool()` to run the trials in, kept after the
      sweep for the next one, whose trials then start in warm workers. The
      caller owns the Ray session (the pool lives in it). Default: workers of
      this sweep's own, ended with it.

  Returns:
    A `SweepResult`.

  Raises:
    SweepConfigError: the sweep file is invalid (nothing has run).
    SweepError: the directory holds another sweep, or there is nothing to resume.
  """
  sweep = schema.load_sweep(sweep)
  if pool is not None:
    pools.check_shared(pool, reuse_workers)
  if smoke_test:
    sweep = smoke_test_sweep(sweep)
  sweep_dir = _prepare_dir(sweep, resume)
  out = stream or sys.stdout
  state = SweepState(
      sweep=sweep, started=time.monotonic(), stream=stream,
      per_optimizer={o: OptimizerState(total=sweep.budget.trials_per_optimizer)
                     for o in sweep.optimizers})
  LIVE[sweep_dir] = state
  results, interrupted, exporting = {}, False, None
  try:
    with futures.ThreadPoolExecutor(1) as background, expected_warnings_silenced(), \
        sweep_session(sweep.resources.address), \
        pools.worker_pool(sweep, reuse_workers, shared=pool) as pool_name:
      # (optimizer, its experiment), or (None, the joint experiment of all).
      experiments = ([(None, os.path.join(sweep_dir, joint.EXPERIMENT))]
                     if joint.applies(sweep, sweep_dir, preferred=one_experiment) else
                     [(o, os.path.join(sweep_dir, o)) for o in sweep.optimizers])
      for optimizer, experiment_dir in experiments:
        progress = SweepProgress(sweep_dir, optimizer, progress_interval_s)
        if resume and tune.Tuner.can_restore(experiment_dir):
          tuner = tune.Tuner.restore(experiment_dir,
                                     trainable=_trainable(sweep, optimizer, pool_name),
                                     resume_unfinished=True, resume_errored=True)
        else:
          tuner = new_tuner(sweep, optimizer, sweep_dir, [progress, *callbacks], pool_name)
        grid = tuner.fit()
        statuses = _saved_statuses(experiment_dir)
        ran = ({optimizer: grid} if optimizer is not None else
               joint.by_optimizer(grid, sweep.optimizers, statuses))
        results.update(ran)
        print_progress(state)
        for name, trials in ran.items():
          for error in trials.errors:
            lines = str(error).strip().splitlines()
            print(f"   {name}: a trial failed: {lines[-1] if lines else error!r}",
                  file=out, flush=True)
        if any(status not in ("TERMINATED", "ERROR") for status in statuses.values()):
          interrupted = True
          print(f"sweep interrupted; continue it with --resume ({sweep_dir})", file=out,
                flush=True)
          break
      if export and not interrupted:  # from Tune's files, while the pool and Ray end
        exporting = background.submit(export_sweep, sweep_dir)
  finally:
    LIVE.pop(sweep_dir, None)
  exported = exporting.result() if exporting is not None else None
  if exported is not None:
    print(exported.leaderboard_markdown, file=out, flush=True)
  return SweepResult(sweep=sweep, sweep_dir=sweep_dir, results=results,
                     interrupted=interrupted, export=exported)
