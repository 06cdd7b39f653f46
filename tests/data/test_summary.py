"""Partition summary: the numbers, the atomic JSON round trip, and the plot file."""

import json
import os

import numpy as np

from tff_fedadamom.data import (partition_summary, plot_partition_summary,
                                save_partition_summary)
from tff_fedadamom.data.summary import summary_from_client_labels


def test_summary_numbers_on_a_hand_computed_case():
  labels = np.array([0, 0, 1, 1, 0, 1])
  parts = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
  s = partition_summary(labels, parts, num_classes=3)
  assert s["num_clients"] == 3 and s["num_examples"] == 6 and s["num_classes"] == 3
  assert s["client_sizes"] == [2, 2, 2]
  assert s["label_histograms"] == [[2, 0, 0], [0, 2, 0], [1, 1, 0]]
  # Global mix (1/2, 1/2, 0): pure clients are 0.5 away, the mixed client 0.
  assert np.isclose(s["heterogeneity"]["mean_tv_distance"], 1 / 3)
  assert np.isclose(s["heterogeneity"]["max_tv_distance"], 0.5)
  assert np.isclose(s["heterogeneity"]["mean_labels_per_client"], 4 / 3)
  assert s["size_stats"] == {"min": 2, "max": 2, "mean": 2.0, "std": 0.0, "median": 2.0}


def test_summary_from_client_labels_matches_index_partition():
  a = summary_from_client_labels([np.array([0, 0]), np.array([[1], [2]])], 3)
  b = partition_summary(np.array([0, 0, 1, 2]), [np.arange(2), np.arange(2, 4)], 3)
  assert a == b


def test_json_round_trip_is_exact_and_atomic(tmp_path):
  labels = np.random.default_rng(0).integers(0, 5, 200)
  s = partition_summary(labels, np.array_split(np.arange(200), 7), 5)
  s["partition"] = {"method": "iid", "options": {}, "seed": 0}
  target = tmp_path / "deep" / "summary.json"
  assert save_partition_summary(s, target) == str(target)
  with open(target) as f:
    assert json.load(f) == s
  assert os.listdir(target.parent) == ["summary.json"]  # no temp file left behind
  s["num_clients"] = 99
  save_partition_summary(s, target)  # overwrite in place
  with open(target) as f:
    assert json.load(f)["num_clients"] == 99


def test_plot_writes_a_png(tmp_path):
  labels = np.repeat(np.arange(4), 25)
  s = partition_summary(labels, np.array_split(np.arange(100), 6), 4)
  path = plot_partition_summary(s, tmp_path / "plots" / "partition.png")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert os.path.getsize(path) > 2000
