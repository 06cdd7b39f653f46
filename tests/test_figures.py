"""Every figure the project draws is saved by `tff_fedadamom.figures`, atomically:
run curves and telemetry, partition summaries and the paper report's plots."""

import json
import os

import numpy as np
import pytest

from benchmarks.paper import report as paper_report
from tff_fedadamom import figures
from tff_fedadamom.data.summary import partition_summary, plot_partition_summary
from tff_fedadamom.metric_names import ROUND, TEST_ACCURACY, TRAIN_LOSS
from tff_fedadamom.experiment import outputs

PNG = b"\x89PNG\r\n\x1a\n"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(paper_report.__file__)), "results.json")


@pytest.fixture
def saved(monkeypatch):
  """The paths written through `figures.save_figure` (its one atomic write)."""
  paths = []
  write = figures.atomic_write_bytes

  def record(path, data):
    paths.append(os.fspath(path))
    write(path, data)

  monkeypatch.setattr(figures, "atomic_write_bytes", record)
  return paths


def _pngs(folder) -> list:
  """Every file under `folder`; each must be a whole PNG (no temp file left)."""
  found = []
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        assert f.read(8) == PNG, path
      found.append(path)
  return sorted(found)


def test_save_figure_writes_a_whole_file_by_rename(tmp_path, monkeypatch):
  renamed = []
  replace = os.replace
  monkeypatch.setattr(os, "replace", lambda a, b: (renamed.append((a, b)), replace(a, b)))
  fig, ax = figures.new_figure(figsize=(2, 2))
  ax.plot([0, 1], [1, 0])
  path = str(tmp_path / "a" / "line.png")
  assert figures.save_figure(fig, path) == path
  ((source, target),) = renamed
  assert target == path and os.path.dirname(source) == os.path.dirname(path)
  assert _pngs(tmp_path) == [path]


def test_run_figures_go_through_the_one_home(tmp_path, saved):
  history = [{ROUND: 1, TRAIN_LOSS: 1.0, "opt/v_median": 1e-3, "opt/v_p01": 1e-4,
              "opt/v_p99": 1e-2, "opt/beta1_mean": 0.5, "opt/frac_beta1_at_0": 0.1,
              "opt/frac_beta1_at_max": 0.2},
             {ROUND: 2, TRAIN_LOSS: 0.5, TEST_ACCURACY: 0.6, "opt/v_median": 2e-3,
              "opt/v_p01": 2e-4, "opt/v_p99": 2e-2, "opt/beta1_mean": 0.4,
              "opt/frac_beta1_at_0": 0.1, "opt/frac_beta1_at_max": 0.3}]
  curves, telemetry = str(tmp_path / "curves.png"), str(tmp_path / "telemetry.png")
  outputs.plot_curves({"run": history}, curves)
  assert outputs.plot_telemetry({"run": history}, telemetry)
  assert not outputs.plot_telemetry({"run": [{ROUND: 1, TRAIN_LOSS: 1.0}]},
                                    str(tmp_path / "none.png"))
  summary = partition_summary(np.repeat(np.arange(3), 10), np.array_split(np.arange(30), 4), 3)
  partition = plot_partition_summary(summary, tmp_path / "partition.png")
  assert sorted(saved) == _pngs(tmp_path) == sorted([curves, telemetry, partition])


def test_the_paper_report_plots_go_through_the_one_home(tmp_path, saved):
  with open(RESULTS) as f:
    doc = json.load(f)
  written = paper_report.write_plots(str(tmp_path), doc)
  assert len(written) == len(doc["results"])  # fmnist's partitions share one plot
  assert sorted(saved) == _pngs(tmp_path) == sorted(written)
