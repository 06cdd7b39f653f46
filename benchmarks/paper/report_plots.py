"""The report's plots, drawn on `matplotlib.figure.Figure` objects (no pyplot, no
backend selection: nothing process-wide changes) and written atomically."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from benchmarks.paper.report_format import PART_NAMES, name
from tff_fedadamom.figures import new_figure, save_figure

PLOTS_DIR = "plots"
# The plot of each study (study 1's holds one panel per partition).
FILES = {"fmnist": "fmnist_curves.png", "shakespeare": "shakespeare_curves.png",
         "beta2": "beta2.png", "escape": "escape.png", "hetero": "heterogeneity.png"}


def relpath(study: str) -> str:
  """Where the report links `study`'s plot (relative to REPORT.md)."""
  return f"{PLOTS_DIR}/{FILES[study]}"


def _save(fig, path: str) -> str:
  fig.tight_layout()
  return save_figure(fig, path)


def plot_curves(panels: Mapping[str, Mapping], methods: Sequence[str], path: str,
                title: str) -> str:
  """Test accuracy over rounds, mean ± sample std over seeds, one panel per table."""
  fig, axes = new_figure(figsize=(5.5 * len(panels), 4), ncols=len(panels), squeeze=False)
  for ax, (panel, summary) in zip(axes[0], panels.items()):
    for opt in methods:
      row = summary["table"].get(opt)
      curve = row["curve"] if row else None
      if not curve or not curve["round"]:
        continue
      mean = np.array(curve["mean"])
      std = np.array([0.0 if s is None else s for s in curve["std"]])
      line, = ax.plot(curve["round"], 100 * mean, label=name(opt),
                      lw=2.2 if opt == "fedadamom" else 1.3)
      ax.fill_between(curve["round"], 100 * (mean - std), 100 * (mean + std),
                      color=line.get_color(), alpha=0.15)
    ax.set(xlabel="round", ylabel="test accuracy (%)", title=panel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(title)
  return _save(fig, path)


def plot_beta2(beta2: Mapping, path: str) -> str:
  fig, ax = new_figure(figsize=(5.5, 4))
  keys = list(next(iter(beta2["table"].values())))  # the grid, as the study ran it
  xs = [float(x) for x in keys]
  for part, row in beta2["table"].items():
    means = [row[x]["final"]["mean"] for x in keys]
    stds = [row[x]["final"]["std"] or 0.0 for x in keys]
    ok = [i for i, m in enumerate(means) if m is not None]
    ax.errorbar([xs[i] for i in ok], [100 * means[i] for i in ok],
                yerr=[100 * stds[i] for i in ok], marker="o", capsize=3,
                label=f"ours, {PART_NAMES.get(part, part)}")
  ax.set(xscale="log", xlabel="beta_2", ylabel="final test accuracy (%)",
         title="FedAdamom beta_2 sensitivity (Fashion-MNIST)")
  ax.set_xticks(xs)
  ax.set_xticklabels([f"{x:g}" for x in xs])
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return _save(fig, path)


def plot_escape(escape: Mapping, path: str) -> str:
  fig, axes = new_figure(figsize=(15, 4), ncols=3)
  for opt, entry in escape["analysis"].items():
    k = np.array(entry["k_used"])
    y = np.array(entry["log_tau"])
    if not k.size:
      continue
    line, = axes[0].plot(1 / k, y, "o-", label=name(opt))
    axes[1].plot(1 / np.sqrt(k), y, "o-", color=line.get_color(), label=name(opt))
    axes[2].plot(k, y, "o", color=line.get_color(), label=name(opt))
    fit = entry.get("fit")
    if fit:
      grid = np.geomspace(k.min(), k.max(), 100)
      axes[2].plot(grid, fit["a"] + fit["c"] * grid ** -fit["p"], "-",
                   color=line.get_color(), alpha=0.7, label=f"fit p={fit['p']:.2f}")
  axes[0].set(xlabel="1/k", ylabel="log(mean escape time, rounds)", title="vs 1/k")
  axes[1].set(xlabel="1/sqrt(k)", ylabel="log(mean escape time, rounds)", title="vs 1/sqrt(k)")
  axes[2].set(xscale="log", xlabel="sharpness k", ylabel="log(mean escape time, rounds)",
              title="log tau = a + c k^-p")
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return _save(fig, path)


def plot_hetero(hetero: Mapping, path: str) -> str:
  fig, ax = new_figure(figsize=(5.5, 4))
  labels = [r["alpha"] for r in hetero["rows"]]
  means = [r["difference"]["mean"] for r in hetero["rows"]]
  stds = [r["difference"]["std"] or 0.0 for r in hetero["rows"]]
  xs = np.arange(len(labels))
  ok = [i for i, m in enumerate(means) if m is not None]
  ax.errorbar(xs[ok], [100 * means[i] for i in ok], yerr=[100 * stds[i] for i in ok],
              marker="o", capsize=3)
  ax.axhline(0.0, color="gray", lw=1)
  ax.set_xticks(xs)
  ax.set_xticklabels([f"Dir({x})" if x != "iid" else "i.i.d." for x in labels])
  ax.set(xlabel="partition (more heterogeneous to the left)",
         ylabel="FedAdamom - FedAdam (accuracy points)",
         title="Gain over FedAdam vs heterogeneity")
  ax.grid(alpha=0.3)
  return _save(fig, path)
