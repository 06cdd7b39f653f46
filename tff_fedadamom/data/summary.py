"""What a partition looks like: client sizes, label histograms and one heterogeneity number.

The heterogeneity measure, the mean total-variation distance between each client's
label distribution and the global one (0 = every client looks like the whole data set,
1 = clients share no labels with the global mix), makes partitioners comparable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from tff_fedadamom.atomic_io import atomic_write_text
from tff_fedadamom.figures import new_figure, save_figure


def partition_summary(labels: np.ndarray, parts: Sequence[np.ndarray],
                      num_classes: int) -> dict:
  """Summarizes a partition (example indices per client of the integer ``labels``)
  as a JSON-ready dict of plain ints, floats and lists."""
  labels = np.asarray(labels)
  hist = np.stack([np.bincount(labels[np.asarray(p, dtype=np.int64)],
                               minlength=num_classes)[:num_classes] for p in parts])
  sizes = hist.sum(axis=1)
  global_dist = hist.sum(axis=0) / max(hist.sum(), 1)
  client_dist = hist / np.maximum(sizes, 1)[:, None]
  tv = 0.5 * np.abs(client_dist - global_dist).sum(axis=1)
  return {
      "num_clients": int(len(parts)),
      "num_examples": int(sizes.sum()),
      "num_classes": int(num_classes),
      "client_sizes": sizes.tolist(),
      "size_stats": {
          "min": int(sizes.min()), "max": int(sizes.max()),
          "mean": float(sizes.mean()), "std": float(sizes.std()),
          "median": float(np.median(sizes)),
      },
      "label_histograms": hist.tolist(),
      "heterogeneity": {
          "mean_tv_distance": float(tv.mean()),
          "max_tv_distance": float(tv.max()),
          "mean_labels_per_client": float((hist > 0).sum(axis=1).mean()),
      },
  }


def summary_from_client_labels(client_labels: Sequence[np.ndarray], num_classes: int) -> dict:
  """The same summary for data sets whose clients are given (no index partition)."""
  labels = np.concatenate([np.asarray(y).reshape(-1) for y in client_labels])
  bounds = np.cumsum([0] + [np.asarray(y).size for y in client_labels])
  parts = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
  return partition_summary(labels, parts, num_classes)


def save_partition_summary(summary: dict, path_json: str | os.PathLike) -> str:
  """Writes the summary as JSON atomically (a reader never sees half a file); returns
  the path."""
  path_json = os.fspath(path_json)
  atomic_write_text(path_json, json.dumps(summary, indent=1))
  return path_json


def plot_partition_summary(summary: dict, path_png: str | os.PathLike) -> str:
  """Plots client sizes and per-client label proportions to a PNG (through
  `tff_fedadamom.figures`: the caller's pyplot backend is left alone)."""
  sizes = np.asarray(summary["client_sizes"])
  hist = np.asarray(summary["label_histograms"], dtype=np.float64)
  props = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
  order = np.argsort(-sizes, kind="stable")

  fig, (ax_sizes, ax_labels) = new_figure(figsize=(11, 4), ncols=2,
                                          gridspec_kw={"width_ratios": [1, 1.4]})
  ax_sizes.bar(np.arange(len(sizes)), sizes[order], width=1.0, color="tab:blue")
  ax_sizes.set_xlabel("client (sorted by size)")
  ax_sizes.set_ylabel("examples")
  ax_sizes.set_title(f"{len(sizes)} clients, {int(sizes.sum())} examples")
  image = ax_labels.imshow(props[order].T, aspect="auto", interpolation="nearest",
                           cmap="viridis", vmin=0.0, vmax=1.0)
  ax_labels.set_xlabel("client (sorted by size)")
  ax_labels.set_ylabel("label")
  het = summary.get("heterogeneity", {})
  ax_labels.set_title("label proportions, mean TV distance "
                      f"{het.get('mean_tv_distance', float('nan')):.3f}")
  fig.colorbar(image, ax=ax_labels)
  fig.tight_layout()
  return save_figure(fig, path_png, dpi=100)
