"""`export_sweep`: best configs, leaderboard and plots from a sweep directory.

Each optimizer's best trial is chosen by `tuning.best` (flagged `complete:
false` if it did not run the whole budget). Written atomically into the sweep directory:
    best/<optimizer>.yaml   a complete experiment config; `tff-fedadamom run`
                            reproduces the trial's objective with the same seed
    leaderboard.csv, leaderboard.md
                            optimizer, best hparams, objective, final metric,
                            rounds to each target, trials run/diverged/stopped/errored
    trials.csv              every trial: status, hparams, objective, node, pid
    export.json             the same, machine-readable, with the best histories
    plots/objective_vs_hparams.png, plots/best_learning_curves.png
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping, Optional, Sequence

from tff_fedadamom.atomic_io import atomic_write_json, atomic_write_text
from tff_fedadamom.metric_names import ROUND, TEST_ACCURACY, TEST_LOSS, TRAIN_LOSS
from tff_fedadamom.experiment.outputs import csv_table, markdown_table, rounds_to_targets
from tff_fedadamom.plain import plain
from tuning import joint
from tuning import schema
from tuning import space as space_lib
from tuning import trainable as trainable_lib
from tuning.best import TrialRecord, choose_best
from tuning.errors import SweepError

__all__ = ["BEST_DIR", "BestTrial", "ExportResult", "PLOTS_DIR", "TrialRecord",
           "best_config_dict", "export_sweep", "read_sweep_trials", "read_trials",
           "write_export"]

BEST_DIR = "best"
PLOTS_DIR = "plots"


@dataclasses.dataclass(frozen=True)
class BestTrial:
  optimizer: str
  trial: TrialRecord
  complete: bool
  config_path: str
  rounds_to_target: Mapping[str, Optional[int]]
  final_metric: Optional[float]


@dataclasses.dataclass(frozen=True)
class ExportResult:
  sweep_dir: str
  best: Mapping[str, BestTrial]
  rows: Sequence[Mapping[str, Any]]
  leaderboard_markdown: str
  files: Sequence[str]


def _experiment_records(experiment_dir: str) -> list[TrialRecord]:
  """The trials of the sweep's Tune experiment (NaN values dropped), each with
  the optimizer its config names (`tuning.joint.split`)."""
  from ray import tune

  analysis = tune.ExperimentAnalysis(experiment_dir)
  frames = analysis.trial_dataframes
  records = []
  for trial in analysis.trials:
    # Keyed by trial id (Ray 2.5x) or by path.
    frame = frames.get(trial.trial_id, frames.get(trial.path))
    rows = [] if frame is None else frame.to_dict("records")
    # A trial restarted from a checkpoint older than its last report reports
    # those rounds again (`tuning.sweep.checkpoint_rounds`): one row per round.
    clean = ({k: plain(v) for k, v in row.items()
              if not (isinstance(v, float) and math.isnan(v))} for row in rows)
    history = trainable_lib.one_row_per_round(h for h in clean if ROUND in h)
    last = history[-1] if history else {}
    name, params = joint.split(trial.config or {})
    records.append(TrialRecord(
        optimizer=name, trial_id=trial.trial_id, status=trial.status,
        params={k: plain(v) for k, v in params.items()},
        history=history, node_id=last.get(trainable_lib.NODE_ID),
        hostname=last.get("hostname"), pid=last.get("pid")))
  return records


def read_sweep_trials(sweep_dir: str, optimizers: Sequence[str]) -> dict[str, list[TrialRecord]]:
  """Optimizer -> its trials, from the sweep's Tune experiment (`tuning.sweep`
  has the layout); empty for an optimizer whose trials never started."""
  experiment_dir = os.path.join(sweep_dir, joint.EXPERIMENT)
  records: dict[str, list[TrialRecord]] = {o: [] for o in optimizers}
  if os.path.isdir(experiment_dir):
    for record in _experiment_records(experiment_dir):
      records.setdefault(record.optimizer, []).append(record)
  return records


def read_trials(sweep_dir: str, optimizer: str) -> list[TrialRecord]:
  """The trials of one optimizer of a sweep (empty if none started)."""
  return read_sweep_trials(sweep_dir, [optimizer])[optimizer]


def best_config_dict(sweep: schema.Sweep, optimizer: str, params: Mapping[str, Any]) -> dict:
  """A trial's exported experiment: its config, a fresh output_dir and name."""
  return space_lib.experiment_dict(
      sweep, optimizer, params, output_dir=f"runs/{sweep.name}/best/{optimizer}",
      name=f"{sweep.name}-best-{optimizer}")


def _fmt(value, digits=4) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e4 else \
        f"{value:.{digits}f}"
  return str(value)


def _markdown(rows: Sequence[Mapping[str, Any]], sweep: schema.Sweep) -> str:
  metric = f"{sweep.metric.name} (mean of last {sweep.metric.last_k}, {sweep.metric.mode})"
  targets = [f"{t:g}" for t in sweep.base.targets]
  header = ["optimizer", "objective", f"final {sweep.metric.name}", "best hparams"]
  header += [f"rounds to {t}" for t in targets]
  header += ["trials run", "diverged", "stopped early", "errored"]
  intro = [f"# Sweep {sweep.name}", "",
           f"Objective: {metric}; {sweep.budget.trials_per_optimizer} trials x "
           f"{sweep.budget.rounds} rounds per optimizer, search {sweep.search.kind}, "
           f"scheduler {sweep.scheduler.kind}.", ""]
  cells = []
  for row in rows:
    cells.append([row["optimizer"], _fmt(row["objective"]), _fmt(row["final_metric"]),
                  row["best_hparams"] or "-"]
                 + [_fmt(row.get(f"rounds_to_{t}")) for t in targets]
                 + [str(row["trials_run"]), str(row["trials_diverged"]),
                    str(row["trials_stopped_early"]), str(row["trials_errored"])])
  text = "\n".join(intro) + "\n" + markdown_table(header, cells)
  incomplete = [r["optimizer"] for r in rows if r["objective"] is not None
                and not r["complete"]]
  if incomplete:
    text += ("\nNo trial of " + ", ".join(incomplete) + " ran the whole budget; "
             "their best was stopped early.\n")
  return text


def _best_config(sweep: schema.Sweep, optimizer: str, chosen: TrialRecord,
                 sweep_dir: str) -> str:
  """Writes the best trial's experiment config, runnable as it is; returns its path."""
  from tff_fedadamom.config import dump_config, load_config

  config = load_config(best_config_dict(sweep, optimizer, chosen.params))
  config_path = os.path.join(sweep_dir, BEST_DIR, f"{optimizer}.yaml")
  header = (f"# Best {optimizer} trial of sweep {sweep.name!r} (trial {chosen.trial_id}):"
            f"\n# {sweep.metric.name} mean of last {sweep.metric.last_k} = "
            f"{chosen.objective!r} over {chosen.rounds} rounds, seed {config.seed}.\n"
            f"# Run it with: tff-fedadamom run {os.path.relpath(config_path)}\n")
  atomic_write_text(config_path, header + dump_config(config))
  return config_path


def _optimizer_row(sweep: schema.Sweep, optimizer: str, records: list[TrialRecord],
                   sweep_dir: str) -> tuple[dict, Optional[BestTrial]]:
  """The leaderboard row of `optimizer`, and its best trial (None if none ran
  to an objective), whose config it writes."""
  chosen, complete = choose_best(records, mode=sweep.metric.mode, rounds=sweep.budget.rounds)
  ran = [r for r in records if r.ran]
  stopped_early = [r for r in ran if not r.diverged and r.status == "TERMINATED"
                   and r.rounds < sweep.budget.rounds]
  row: dict[str, Any] = {"optimizer": optimizer, "objective": None, "final_metric": None,
                         "best_hparams": "", "complete": None}
  best = None
  if chosen is not None:
    config_path = _best_config(sweep, optimizer, chosen, sweep_dir)
    targets = rounds_to_targets(chosen.history, sweep.base.targets)
    best = BestTrial(optimizer, chosen, complete, config_path, targets,
                     chosen.last.get(sweep.metric.name))
    row.update(objective=chosen.objective, final_metric=chosen.last.get(sweep.metric.name),
               best_hparams=" ".join(f"{k}={_fmt(v)}" for k, v in chosen.params.items()),
               complete=complete, trial_id=chosen.trial_id)
    row.update({f"rounds_to_{t}": r for t, r in targets.items()})
    row.update({f"hparam/{k}": v for k, v in chosen.params.items()})
  else:
    row.update({f"rounds_to_{t:g}": None for t in sweep.base.targets})
  row.update(trials_run=len(ran), trials_diverged=sum(r.diverged for r in ran),
             trials_stopped_early=len(stopped_early),
             trials_errored=sum(r.status == "ERROR" for r in records))
  return row, best


def _trial_row(optimizer: str, r: TrialRecord) -> dict:
  return {"optimizer": optimizer, "trial_id": r.trial_id, "status": r.status,
          "rounds": r.rounds, "objective": r.objective, "diverged": int(r.diverged),
          **{f"hparam/{k}": v for k, v in r.params.items()},
          "node_id": r.node_id, "hostname": r.hostname, "pid": r.pid}


def _best_json(best: BestTrial, sweep_dir: str) -> dict:
  """A best trial in export.json: its result, config and objective history."""
  kept = (ROUND, trainable_lib.OBJECTIVE, TEST_ACCURACY, TEST_LOSS, TRAIN_LOSS)
  return {"trial_id": best.trial.trial_id, "objective": best.trial.objective,
          "complete": best.complete, "params": dict(best.trial.params),
          "config": os.path.relpath(best.config_path, sweep_dir),
          "rounds_to_target": dict(best.rounds_to_target),
          "history": [{k: v for k, v in h.items() if k in kept} for h in best.trial.history]}


def write_export(sweep: schema.Sweep, records_by_opt: Mapping[str, list[TrialRecord]],
                 sweep_dir: str, plots: bool = True) -> ExportResult:
  """Writes best configs, leaderboard, trial table and plots from trial records."""
  best: dict[str, BestTrial] = {}
  rows, trial_rows = [], []
  for optimizer in sweep.optimizers:
    records = records_by_opt.get(optimizer, [])
    row, chosen = _optimizer_row(sweep, optimizer, records, sweep_dir)
    rows.append(row)
    if chosen is not None:
      best[optimizer] = chosen
    trial_rows += [_trial_row(optimizer, r) for r in records]
  files = [b.config_path for b in best.values()]
  markdown = _markdown(rows, sweep)
  for name, text in (("leaderboard.csv", csv_table(rows, lineterminator="\n")),
                     ("leaderboard.md", markdown),
                     ("trials.csv", csv_table(trial_rows, lineterminator="\n"))):
    atomic_write_text(os.path.join(sweep_dir, name), text)
    files.append(os.path.join(sweep_dir, name))
  atomic_write_json(os.path.join(sweep_dir, "export.json"), {
      "sweep": sweep.name,
      "metric": dataclasses.asdict(sweep.metric),
      "budget": dataclasses.asdict(sweep.budget),
      "leaderboard": rows,
      "best": {o: _best_json(b, sweep_dir) for o, b in best.items()},
      "trials": trial_rows,
  })
  files.append(os.path.join(sweep_dir, "export.json"))
  if plots:
    from tuning.plots import plot_sweep

    files += plot_sweep(records_by_opt, best, sweep, os.path.join(sweep_dir, PLOTS_DIR))
  return ExportResult(sweep_dir, best, rows, markdown, files)


def export_sweep(sweep_dir: str, *, plots: bool = True) -> ExportResult:
  """Exports a sweep directory, finished or interrupted (what has run), any
  number of times while nothing else writes to it."""
  sweep_dir = os.path.abspath(sweep_dir)
  path = os.path.join(sweep_dir, schema.SWEEP_FILE)
  if not os.path.exists(path):
    raise SweepError(f"{sweep_dir}: not a sweep directory (no {schema.SWEEP_FILE})")
  sweep = schema.load_sweep(path)
  records = read_sweep_trials(sweep_dir, sweep.optimizers)
  return write_export(sweep, records, sweep_dir, plots=plots)
