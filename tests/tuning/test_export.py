"""Export from a hand-made trial table: the choice of best, the leaderboard, the
exported configs and the plots."""

import csv
import json
import os

import pytest

from tests.helpers import tiny_base
from tff_fedadamom.config import load_config
from tff_fedadamom.metric_names import TEST_ACCURACY, TEST_LOSS
from tuning import load_sweep
from tuning.export import TrialRecord, write_export


def _history(accs, lr_diverged=False, last_k=2):
  rows = []
  for i, acc in enumerate(accs, start=1):
    window = accs[max(0, i - last_k):i]
    rows.append({"round": i, TEST_ACCURACY: acc, TEST_LOSS: 1.0 - acc,
                 "objective": -1e300 if lr_diverged and i == len(accs) else
                 sum(window) / len(window),
                 "diverged": int(lr_diverged and i == len(accs))})
  return rows


def _record(optimizer, trial_id, lr, accs, diverged=False, status="TERMINATED"):
  return TrialRecord(optimizer, trial_id, status, {"server.learning_rate": lr},
                     _history(accs, diverged), node_id="n1", hostname="h", pid=1)


@pytest.fixture
def sweep():
  return load_sweep({
      "name": "fake", "base": tiny_base(targets=[0.5, 0.8]),
      "optimizers": ["fedavg", "fedadamom"],
      "budget": {"trials_per_optimizer": 4, "rounds": 3},
      "space": {"client.learning_rate": None, "server.epsilon": None,
                "server.beta_2": None},
      "metric": {"name": TEST_ACCURACY, "last_k": 2}})


def test_best_is_complete_and_finite(tmp_path, sweep):
  records = {
      "fedavg": [
          # Highest accuracy of all, but diverged: never the best.
          _record("fedavg", "d", 1e6, [0.9, 0.95, 0.99], diverged=True),
          # Stopped early by ASHA at a high value: a full-budget trial wins.
          _record("fedavg", "e", 0.3, [0.85]),
          _record("fedavg", "a", 0.5, [0.4, 0.6, 0.7]),
          _record("fedavg", "b", 2.0, [0.3, 0.5, 0.6]),
          _record("fedavg", "x", 9.0, [], status="ERROR"),
      ],
      "fedadamom": [_record("fedadamom", "c", 1.0, [0.5, 0.7, 0.8])],
  }
  result = write_export(sweep, records, str(tmp_path))
  assert result.best["fedavg"].trial.trial_id == "a"
  assert result.best["fedavg"].complete
  assert result.best["fedavg"].rounds_to_target == {"0.5": 2, "0.8": None}
  assert result.best["fedadamom"].rounds_to_target == {"0.5": 1, "0.8": 3}

  config = load_config(os.path.join(tmp_path, "best", "fedavg.yaml"))
  assert config.server.optimizer == "fedavg"
  assert config.server.hparams["learning_rate"] == 0.5
  assert config.rounds == 3 and config.seed == 0
  assert config.output_dir == "runs/fake/best/fedavg"

  with open(tmp_path / "leaderboard.csv") as f:
    rows = {r["optimizer"]: r for r in csv.DictReader(f)}
  assert rows["fedavg"]["trials_run"] == "4"
  assert rows["fedavg"]["trials_diverged"] == "1"
  assert rows["fedavg"]["trials_stopped_early"] == "1"
  assert rows["fedavg"]["trials_errored"] == "1"
  assert float(rows["fedavg"]["objective"]) == pytest.approx(0.65)
  assert rows["fedavg"]["rounds_to_0.5"] == "2"
  markdown = (tmp_path / "leaderboard.md").read_text()
  assert "| fedavg | 0.6500 |" in markdown and "server.learning_rate=0.5000" in markdown
  with open(tmp_path / "trials.csv") as f:
    trials = list(csv.DictReader(f))
  assert len(trials) == 6 and {t["hostname"] for t in trials} == {"h"}
  exported = json.loads((tmp_path / "export.json").read_text())
  assert exported["best"]["fedadamom"]["params"] == {"server.learning_rate": 1.0}
  for name in ("objective_vs_hparams.png", "best_learning_curves.png"):
    assert os.path.getsize(tmp_path / "plots" / name) > 1000


def test_only_early_stopped_or_diverged(tmp_path, sweep):
  records = {
      "fedavg": [_record("fedavg", "e", 0.3, [0.85])],
      "fedadamom": [_record("fedadamom", "d", 1e6, [0.9, 0.9, 0.9], diverged=True)],
  }
  result = write_export(sweep, records, str(tmp_path), plots=False)
  assert not result.best["fedavg"].complete
  assert "fedadamom" not in result.best
  assert not os.path.exists(tmp_path / "best" / "fedadamom.yaml")
  assert "ran the whole budget" in result.leaderboard_markdown
