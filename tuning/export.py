"""`export_sweep`: best configs, leaderboard and plots from a sweep directory.

For each optimizer the best trial is chosen among the trials that did not
diverge and that ran the whole budget (`budget.rounds`; trials ASHA stopped
early are compared at an earlier round and would not reproduce at the full
one). Only if no trial of an optimizer ran to the end is the best of the
others taken, flagged `complete: false`.

Written (atomically) into the sweep directory:
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

import csv
import dataclasses
import io
import math
import os
from typing import Any, Iterable, Mapping, Optional, Sequence

from tuning import schema
from tuning import space as space_lib
from tuning import trainable as trainable_lib

BEST_DIR = "best"
PLOTS_DIR = "plots"


@dataclasses.dataclass(frozen=True)
class TrialRecord:
  """One trial as the export sees it (read from Tune's experiment, or built by hand).

  Attributes:
    optimizer, trial_id, status: Tune's status (TERMINATED, ERROR, ...).
    params: Dotted path -> sampled value.
    history: One dict per report (`round`, `objective`, `diverged`, metrics...).
    node_id, hostname, pid: Where the trial ran (last report).
  """

  optimizer: str
  trial_id: str
  status: str
  params: Mapping[str, Any]
  history: Sequence[Mapping[str, Any]]
  node_id: Optional[str] = None
  hostname: Optional[str] = None
  pid: Optional[int] = None

  @property
  def last(self) -> Mapping[str, Any]:
    return self.history[-1] if self.history else {}

  @property
  def rounds(self) -> int:
    return int(self.last.get(trainable_lib.ROUND, 0) or 0)

  @property
  def objective(self) -> Optional[float]:
    value = self.last.get(trainable_lib.OBJECTIVE)
    return None if value is None else float(value)

  @property
  def diverged(self) -> bool:
    return bool(self.last.get(trainable_lib.DIVERGED, 0))

  @property
  def ran(self) -> bool:
    return bool(self.history)


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


# ---------------------------------------------------------------------------- reading


def _clean(value):
  if isinstance(value, float) and math.isnan(value):
    return None
  return space_lib.plain(value)


def read_trials(sweep_dir: str, optimizer: str) -> list[TrialRecord]:
  """The trials of one optimizer's Tune experiment (empty if it never started)."""
  from ray import tune

  experiment_dir = os.path.join(sweep_dir, optimizer)
  if not os.path.isdir(experiment_dir):
    return []
  analysis = tune.ExperimentAnalysis(experiment_dir)
  frames = analysis.trial_dataframes
  records = []
  for trial in analysis.trials:
    frame = frames.get(trial.trial_id)  # keyed by trial id (Ray 2.5x) or by path
    if frame is None:
      frame = frames.get(trial.path)
    history = []
    if frame is not None and len(frame):
      for row in frame.to_dict("records"):
        history.append({k: _clean(v) for k, v in row.items()
                        if not (isinstance(v, float) and math.isnan(v))})
    last = history[-1] if history else {}
    records.append(TrialRecord(
        optimizer=optimizer, trial_id=trial.trial_id, status=trial.status,
        params={k: space_lib.plain(v) for k, v in (trial.config or {}).items()},
        history=history, node_id=last.get("node_id"), hostname=last.get("hostname"),
        pid=last.get("pid")))
  return records


# ---------------------------------------------------------------------------- choosing


def is_better(a: float, b: Optional[float], mode: str) -> bool:
  return b is None or (a > b if mode == "max" else a < b)


def choose_best(records: Iterable[TrialRecord], sweep: schema.Sweep
                ) -> tuple[Optional[TrialRecord], bool]:
  """The best non-diverged trial, preferring those that ran the whole budget.

  Returns (trial or None, whether it ran the whole budget).
  """
  eligible = [r for r in records if r.ran and not r.diverged and r.objective is not None
              and math.isfinite(r.objective)]
  complete = [r for r in eligible if r.rounds >= sweep.budget.rounds]
  pool = complete or eligible
  best = None
  for record in pool:
    if best is None or is_better(record.objective, best.objective, sweep.metric.mode):
      best = record
  return best, bool(complete)


def rounds_to_target(history: Iterable[Mapping[str, Any]], targets: Iterable[float]
                     ) -> dict[str, Optional[int]]:
  """First reported round whose test accuracy reaches each target (None: never)."""
  out = {}
  rows = [(int(r[trainable_lib.ROUND]), r["test/accuracy"]) for r in history
          if r.get("test/accuracy") is not None and trainable_lib.ROUND in r]
  for target in targets:
    out[f"{target:g}"] = next((rnd for rnd, acc in rows if acc >= target), None)
  return out


def best_config_dict(sweep: schema.Sweep, optimizer: str, params: Mapping[str, Any]) -> dict:
  """The exported experiment of a trial: the trial's config with a fresh
  output_dir, a descriptive name and the base's thread setting."""
  tree = space_lib.experiment_dict(
      sweep, optimizer, params, output_dir=f"runs/{sweep.name}/best/{optimizer}",
      name=f"{sweep.name}-best-{optimizer}")
  return tree


# ---------------------------------------------------------------------------- writing


def _fmt(value, digits=4) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e4 else \
        f"{value:.{digits}f}"
  return str(value)


def _csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
  columns: list[str] = []
  for row in rows:
    columns += [k for k in row if k not in columns]
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
  return buffer.getvalue()


def _markdown(rows: Sequence[Mapping[str, Any]], sweep: schema.Sweep) -> str:
  metric = f"{sweep.metric.name} (mean of last {sweep.metric.last_k}, {sweep.metric.mode})"
  targets = [f"{t:g}" for t in sweep.base.targets]
  header = ["optimizer", "objective", f"final {sweep.metric.name}", "best hparams"]
  header += [f"rounds to {t}" for t in targets]
  header += ["trials run", "diverged", "stopped early", "errored"]
  lines = [f"# Sweep {sweep.name}", "",
           f"Objective: {metric}; {sweep.budget.trials_per_optimizer} trials x "
           f"{sweep.budget.rounds} rounds per optimizer, search {sweep.search.kind}, "
           f"scheduler {sweep.scheduler.kind}.", "",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for row in rows:
    cells = [row["optimizer"], _fmt(row["objective"]), _fmt(row["final_metric"]),
             row["best_hparams"] or "-"]
    cells += [_fmt(row.get(f"rounds_to_{t}")) for t in targets]
    cells += [str(row["trials_run"]), str(row["trials_diverged"]),
              str(row["trials_stopped_early"]), str(row["trials_errored"])]
    lines.append("| " + " | ".join(cells) + " |")
  incomplete = [r["optimizer"] for r in rows if r["objective"] is not None
                and not r["complete"]]
  if incomplete:
    lines += ["", "No trial of " + ", ".join(incomplete) + " ran the whole budget; "
              "their best was stopped early."]
  return "\n".join(lines) + "\n"


def _plot(records_by_opt: Mapping[str, list[TrialRecord]], best: Mapping[str, BestTrial],
          sweep: schema.Sweep, plots_dir: str) -> list[str]:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from tff_fedadamom.pipeline.outputs import save_figure

  files = []
  spaces = {o: space_lib.resolve(sweep, o) for o in sweep.optimizers}
  columns = max([len(s.tuned) for s in spaces.values()] + [1])
  rows = len(sweep.optimizers)
  fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.8 * rows),
                           squeeze=False)
  for i, optimizer in enumerate(sweep.optimizers):
    space = spaces[optimizer]
    records = [r for r in records_by_opt.get(optimizer, []) if r.ran]
    for j in range(columns):
      ax = axes[i][j]
      if j >= len(space.tuned):
        ax.axis("off")
        continue
      path, dist = list(space.tuned.items())[j]
      ok = [r for r in records if not r.diverged and r.objective is not None]
      bad = [r for r in records if r.diverged]
      full = [r for r in ok if r.rounds >= sweep.budget.rounds]
      early = [r for r in ok if r.rounds < sweep.budget.rounds]
      numeric = all(isinstance(r.params.get(path), (int, float)) for r in records)
      x = (lambda rs: [r.params.get(path) for r in rs]) if numeric else \
          (lambda rs: [str(r.params.get(path)) for r in rs])
      if full:
        ax.scatter(x(full), [r.objective for r in full], s=18, label="full budget")
      if early:
        ax.scatter(x(early), [r.objective for r in early], s=18, facecolors="none",
                   edgecolors="grey", label="stopped early")
      if bad:
        floor = min([r.objective for r in ok], default=0.0)
        ax.scatter(x(bad), [floor] * len(bad), marker="x", color="red", s=22,
                   label="diverged")
      chosen = best.get(optimizer)
      if chosen is not None:
        ax.scatter(x([chosen.trial]), [chosen.trial.objective], marker="*", s=120,
                   color="gold", edgecolors="black", label="best", zorder=3)
      if numeric and dist.dist == "loguniform":
        ax.set_xscale("log")
        ax.set_xlim(dist.low / 1.3, dist.high * 1.3)  # the whole searched range
      elif numeric and dist.dist == "uniform":
        margin = 0.04 * (dist.high - dist.low)
        ax.set_xlim(dist.low - margin, dist.high + margin)
      ax.set_xlabel(path, fontsize=8)
      if j == 0:
        ax.set_ylabel(f"{optimizer}\n{sweep.metric.name}", fontsize=8)
      ax.tick_params(labelsize=7)
      ax.grid(alpha=0.3)
      if i == 0 and j == 0:
        ax.legend(fontsize=6)
  fig.suptitle(f"{sweep.name}: objective vs hparams (search range on x)")
  fig.tight_layout(rect=(0, 0, 1, 0.97))
  path = os.path.join(plots_dir, "objective_vs_hparams.png")
  save_figure(fig, path)
  plt.close(fig)
  files.append(path)

  fig, ax = plt.subplots(figsize=(7, 4.2))
  for optimizer, chosen in best.items():
    points = [(r[trainable_lib.ROUND], r[sweep.metric.name]) for r in chosen.trial.history
              if r.get(sweep.metric.name) is not None and trainable_lib.ROUND in r]
    if points:
      ax.plot(*zip(*points), marker="o", markersize=3, label=optimizer)
  ax.set(xlabel="round", ylabel=sweep.metric.name,
         title=f"{sweep.name}: learning curves of the best trials")
  ax.grid(alpha=0.3)
  if best:
    ax.legend(fontsize=8)
  fig.tight_layout()
  path = os.path.join(plots_dir, "best_learning_curves.png")
  save_figure(fig, path)
  plt.close(fig)
  files.append(path)
  return files


def write_export(sweep: schema.Sweep, records_by_opt: Mapping[str, list[TrialRecord]],
                 sweep_dir: str, plots: bool = True) -> ExportResult:
  """Writes best configs, leaderboard, trial table and plots from trial records."""
  from tff_fedadamom.atomic_io import atomic_write_json, atomic_write_text
  from tff_fedadamom.config import dump_config, load_config

  best: dict[str, BestTrial] = {}
  rows, trial_rows, files = [], [], []
  for optimizer in sweep.optimizers:
    records = records_by_opt.get(optimizer, [])
    chosen, complete = choose_best(records, sweep)
    ran = [r for r in records if r.ran]
    stopped_early = [r for r in ran if not r.diverged and r.status == "TERMINATED"
                     and r.rounds < sweep.budget.rounds]
    row: dict[str, Any] = {"optimizer": optimizer, "objective": None, "final_metric": None,
                           "best_hparams": "", "complete": None}
    if chosen is not None:
      config = load_config(best_config_dict(sweep, optimizer, chosen.params))
      config_path = os.path.join(sweep_dir, BEST_DIR, f"{optimizer}.yaml")
      header = (f"# Best {optimizer} trial of sweep {sweep.name!r} (trial {chosen.trial_id}):"
                f"\n# {sweep.metric.name} mean of last {sweep.metric.last_k} = "
                f"{chosen.objective!r} over {chosen.rounds} rounds, seed {config.seed}.\n"
                f"# Run it with: tff-fedadamom run {os.path.relpath(config_path)}\n")
      atomic_write_text(config_path, header + dump_config(config))
      files.append(config_path)
      targets = rounds_to_target(chosen.history, sweep.base.targets)
      best[optimizer] = BestTrial(optimizer, chosen, complete, config_path, targets,
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
    rows.append(row)
    for r in records:
      trial_rows.append({
          "optimizer": optimizer, "trial_id": r.trial_id, "status": r.status,
          "rounds": r.rounds, "objective": r.objective, "diverged": int(r.diverged),
          **{f"hparam/{k}": v for k, v in r.params.items()},
          "node_id": r.node_id, "hostname": r.hostname, "pid": r.pid})

  markdown = _markdown(rows, sweep)
  for name, text in (("leaderboard.csv", _csv_text(rows)),
                     ("leaderboard.md", markdown),
                     ("trials.csv", _csv_text(trial_rows))):
    atomic_write_text(os.path.join(sweep_dir, name), text)
    files.append(os.path.join(sweep_dir, name))
  atomic_write_json(os.path.join(sweep_dir, "export.json"), {
      "sweep": sweep.name,
      "metric": dataclasses.asdict(sweep.metric),
      "budget": dataclasses.asdict(sweep.budget),
      "leaderboard": rows,
      "best": {o: {"trial_id": b.trial.trial_id, "objective": b.trial.objective,
                   "complete": b.complete, "params": dict(b.trial.params),
                   "config": os.path.relpath(b.config_path, sweep_dir),
                   "rounds_to_target": dict(b.rounds_to_target),
                   "history": [{k: v for k, v in h.items()
                                if k in (trainable_lib.ROUND, trainable_lib.OBJECTIVE,
                                         "test/accuracy", "test/loss", "train/loss")}
                               for h in b.trial.history]}
               for o, b in best.items()},
      "trials": trial_rows,
  })
  files.append(os.path.join(sweep_dir, "export.json"))
  if plots:
    files += _plot(records_by_opt, best, sweep, os.path.join(sweep_dir, PLOTS_DIR))
  return ExportResult(sweep_dir, best, rows, markdown, files)


def export_sweep(sweep_dir: str, *, plots: bool = True) -> ExportResult:
  """Exports a sweep directory (see the module docstring). Safe to run while
  nothing else writes to it, any number of times, on a finished or an
  interrupted sweep (it exports what has run)."""
  from tuning.sweep import SWEEP_FILE, SweepError

  sweep_dir = os.path.abspath(sweep_dir)
  path = os.path.join(sweep_dir, SWEEP_FILE)
  if not os.path.exists(path):
    raise SweepError(f"{sweep_dir}: not a sweep directory (no {SWEEP_FILE})")
  sweep = schema.load_sweep(path)
  records = {o: read_trials(sweep_dir, o) for o in sweep.optimizers}
  return write_export(sweep, records, sweep_dir, plots=plots)
