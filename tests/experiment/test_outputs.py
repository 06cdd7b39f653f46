"""Run outputs: rounds to target from any history, the table writers against
the standard library's csv, and figures drawn without process-wide state."""

import csv
import io
import os
import subprocess
import sys

from tff_fedadamom.metric_names import TEST_ACCURACY, TRAIN_LOSS
from tff_fedadamom.experiment import outputs
from tests.helpers import ROOT


def test_rounds_to_targets_reads_csv_rows_and_tune_reports():
  history = [{"round": 1, TRAIN_LOSS: 2.0},                  # no evaluation
             {"round": 2, TEST_ACCURACY: 0.41},
             {"round": 3.0, TEST_ACCURACY: None},             # Tune: NaN cleaned to None
             {TEST_ACCURACY: 0.99},                           # no round: not a round row
             {"round": 4.0, TEST_ACCURACY: 0.8}]
  got = outputs.rounds_to_targets(history, [0.4, 0.5, 0.8, 0.95])
  assert got == {"0.4": 2, "0.5": 4, "0.8": 4, "0.95": None}
  assert all(isinstance(r, int) for r in got.values() if r is not None)


def _dict_writer(rows, fields, lineterminator):
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator=lineterminator)
  writer.writeheader()
  writer.writerows(rows)
  return buffer.getvalue()


def test_csv_table_is_the_standard_dict_writer():
  rows = [{"a": 1, "b": None, "c": "x,y"}, {"a": 2.5, "d": True}]
  for ending in ("\r\n", "\n"):
    assert outputs.csv_table(rows, lineterminator=ending) == _dict_writer(
        rows, ["a", "b", "c", "d"], ending)
  assert outputs.csv_rows(["round", "x"], [["1", "2"]]) == "round,x\r\n1,2\r\n"


def test_markdown_table():
  text = outputs.markdown_table(["a", "b"], [[1, None], [0.5, "x"]],
                                cell=lambda v: "-" if v is None else str(v))
  assert text == "| a | b |\n|---|---|\n| 1 | - |\n| 0.5 | x |\n"


def test_figures_leave_matplotlib_as_they_found_it(tmp_path):
  """In a fresh interpreter (pyplot never imported), plotting a run neither imports
  pyplot nor picks a backend, and still writes the PNG."""
  script = f"""
import sys, matplotlib
backend = matplotlib.rcParams._get_backend_or_none()
from tff_fedadamom.experiment import outputs
history = [{{"round": 1, "{TRAIN_LOSS}": 1.0, "{TEST_ACCURACY}": 0.3}},
           {{"round": 2, "{TRAIN_LOSS}": 0.5, "{TEST_ACCURACY}": 0.6}}]
outputs.plot_curves({{"run": history}}, sys.argv[1], title="t")
assert "matplotlib.pyplot" not in sys.modules, "pyplot imported"
assert matplotlib.rcParams._get_backend_or_none() == backend, "backend changed"
"""
  path = str(tmp_path / "curves.png")
  result = subprocess.run([sys.executable, "-c", script, path], cwd=ROOT, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
  assert result.returncode == 0, result.stderr[-3000:]
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
