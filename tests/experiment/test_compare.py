"""`compare` (one run per optimizer) and `plot_runs` on tiny real data."""

import os

import pytest

from tff_fedadamom.experiment import outputs
from tff_fedadamom.experiment.compare import compare, optimizer_variant, plot_runs
from tff_fedadamom.config import load_config
from tests.helpers import tiny


def test_compare_runs_each_optimizer_and_writes_table_and_plots(tmp_path):
  table = compare(tiny(tmp_path / "cmp", rounds=2), ["fedadamom", "fedadam"], progress=False)
  lines = table.splitlines()
  assert lines[0].startswith("| optimizer | status")
  assert {lines[2].split("|")[1].strip(), lines[3].split("|")[1].strip()} == {
      "fedadamom", "fedadam"}
  for name in ("compare.md", "compare.csv", "compare_curves.png", "compare_telemetry.png"):
    assert os.path.getsize(tmp_path / "cmp" / name) > 0, name
  for opt in ("fedadamom", "fedadam"):
    assert (tmp_path / "cmp" / opt / outputs.SUMMARY_FILE).exists()


def test_variant_keeps_own_hparams_and_resets_others(tmp_path):
  base = load_config(tiny(tmp_path / "v", server__beta_2=0.2))
  same = optimizer_variant(base, "fedadamom")
  other = optimizer_variant(base, "fedadam")
  assert same.server.hparams["beta_2"] == 0.2
  assert other.server.hparams["beta_2"] == 0.999  # fedadam's own default
  assert other.output_dir.endswith(os.path.join("v", "fedadam"))


def test_compare_rejects_unknown_optimizer_before_running(tmp_path):
  with pytest.raises(ValueError, match="Unknown server optimizer 'fedsgd'"):
    compare(tiny(tmp_path / "x"), ["fedadamom", "fedsgd"], progress=False)
  assert not (tmp_path / "x" / "fedadamom").exists()


def test_plot_runs_rejects_a_directory_without_metrics(tmp_path):
  with pytest.raises(FileNotFoundError, match="not a run directory"):
    plot_runs([str(tmp_path)])
