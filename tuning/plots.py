"""The sweep export's plots (`tff_fedadamom.figures`): objective vs each searched
hparam per optimizer, and the learning curves of the best trials."""

from __future__ import annotations

import os
from typing import Any, Mapping

from matplotlib.ticker import MaxNLocator, NullLocator

from tff_fedadamom.figures import margins_in_inches, new_figure, save_figure
from tff_fedadamom.metric_names import ROUND
from tuning import space as space_lib
from tuning.best import TrialRecord
from tuning.schema import Sweep


def plot_sweep(records_by_opt: Mapping[str, list[TrialRecord]], best: Mapping[str, Any],
               sweep: Sweep, plots_dir: str) -> list[str]:
  """Draws objective_vs_hparams.png and best_learning_curves.png into `plots_dir`;
  returns their paths. `best` maps an optimizer to its `tuning.export.BestTrial`."""
  return [_objective_vs_hparams(records_by_opt, best, sweep,
                                os.path.join(plots_dir, "objective_vs_hparams.png")),
          _best_curves(best, sweep, os.path.join(plots_dir, "best_learning_curves.png"))]


def _objective_vs_hparams(records_by_opt: Mapping[str, list[TrialRecord]],
                          best: Mapping[str, Any], sweep: Sweep, path: str) -> str:
  """One row of axes per optimizer, one axis per tuned dimension."""
  spaces = {o: space_lib.resolve(sweep, o) for o in sweep.optimizers}
  columns = max([len(s.tuned) for s in spaces.values()] + [1])
  rows = len(sweep.optimizers)
  width, height = 3.6 * columns, 2.8 * rows
  fig, axes = new_figure(figsize=(width, height), nrows=rows, ncols=columns, squeeze=False)
  margins_in_inches(fig, left=0.85, right=0.15, bottom=0.5, top=0.45, wspace=0.3)
  for i, optimizer in enumerate(sweep.optimizers):
    records = [r for r in records_by_opt.get(optimizer, []) if r.ran]
    dimensions = list(spaces[optimizer].tuned.items())
    for j in range(columns):
      ax = axes[i][j]
      if j >= len(dimensions):
        ax.axis("off")
        continue
      _draw_dimension(ax, records, *dimensions[j], best.get(optimizer), sweep.budget.rounds)
      if j == 0:
        ax.set_ylabel(f"{optimizer}\n{sweep.metric.name}", fontsize=8)
      if i == 0 and j == 0:
        ax.legend(fontsize=6)
  fig.suptitle(f"{sweep.name}: objective vs hparams (search range on x)",
               y=1 - 0.12 / height, va="top")
  return save_figure(fig, path)


def _draw_dimension(ax, records: list[TrialRecord], path: str, dist, chosen,
                    rounds: int) -> None:
  """The objective of each trial against its value of dimension `path`: full
  budget, stopped early, diverged (at the lowest objective), and the best
  trial `chosen` (None if none); the x axis spans the whole searched range."""
  ok = [r for r in records if not r.diverged and r.objective is not None]
  bad = [r for r in records if r.diverged]
  full = [r for r in ok if r.rounds >= rounds]
  early = [r for r in ok if r.rounds < rounds]
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
    ax.scatter(x(bad), [floor] * len(bad), marker="x", color="red", s=22, label="diverged")
  if chosen is not None:
    ax.scatter(x([chosen.trial]), [chosen.trial.objective], marker="*", s=120,
               color="gold", edgecolors="black", label="best", zorder=3)
  if numeric and dist.dist == "loguniform":
    ax.set_xscale("log")
    ax.set_xlim(dist.low / 1.3, dist.high * 1.3)  # the whole searched range
    # Decades only: minor ticks of 40 log axes cost seconds of rendering.
    ax.xaxis.set_minor_locator(NullLocator())
  elif numeric and dist.dist == "uniform":
    margin = 0.04 * (dist.high - dist.low)
    ax.set_xlim(dist.low - margin, dist.high + margin)
    ax.xaxis.set_major_locator(MaxNLocator(4))
  # A few ticks per axis: matplotlib builds each tick's lines and labels anew
  # on every draw, most of the time a grid of 40 axes takes to render.
  ax.yaxis.set_major_locator(MaxNLocator(4))
  ax.set_xlabel(path, fontsize=8)
  ax.tick_params(labelsize=7)
  ax.grid(alpha=0.3)


def _best_curves(best: Mapping[str, Any], sweep: Sweep, path: str) -> str:
  """The objective's metric over rounds for each optimizer's best trial."""
  fig, ax = new_figure(figsize=(7, 4.2))
  for optimizer, chosen in best.items():
    points = [(r[ROUND], r[sweep.metric.name]) for r in chosen.trial.history
              if r.get(sweep.metric.name) is not None and ROUND in r]
    if points:
      ax.plot(*zip(*points), marker="o", markersize=3, label=optimizer)
  ax.set(xlabel="round", ylabel=sweep.metric.name,
         title=f"{sweep.name}: learning curves of the best trials")
  ax.grid(alpha=0.3)
  if best:
    ax.legend(fontsize=8)
  margins_in_inches(fig, top=0.35)
  return save_figure(fig, path)
