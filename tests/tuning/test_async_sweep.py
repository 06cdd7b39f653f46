"""A sweep of asynchronous runs: tuned like synchronous ones (an `asynchronous`
field in the space too), and each exported config re-runs to its trial's
objective bit for bit."""

import json
import os

from tests.helpers import metrics_rows, tiny_base
from tests.tuning.conftest import write_sweep
from tff_fedadamom.config import load_config
from tff_fedadamom.experiment import run_experiment
from tff_fedadamom.metric_names import MAX_STALENESS, TEST_ACCURACY
from tuning import run_sweep
from tuning.trainable import objective_from_history


def test_an_asynchronous_sweep_exports_configs_that_reproduce_it(tmp_path):
  base = tiny_base(asynchronous={"concurrency": 5, "buffer_size": 2,
                                 "staleness": {"kind": "polynomial", "a": 0.5}})
  path = write_sweep(tmp_path, {
      "name": "async", "base": base, "optimizers": ["fadas"],
      "budget": {"trials_per_optimizer": 2, "rounds": 3},
      "space": {"asynchronous.staleness.a": {"dist": "uniform", "low": 0.1, "high": 1.0}},
      "search": {"kind": "random", "seed": 0},
      "metric": {"name": TEST_ACCURACY, "last_k": 2},
      "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 2,
                    "storage_path": str(tmp_path / "sweeps")}})
  result = run_sweep(path, progress_interval_s=60)
  best = json.load(open(os.path.join(result.sweep_dir, "export.json")))["best"]["fadas"]
  config = load_config(os.path.join(result.sweep_dir, best["config"]))
  assert config.asynchronous.concurrency == 5
  assert config.asynchronous.staleness["a"] == best["params"]["asynchronous.staleness.a"]
  rerun = run_experiment(config, overrides=[f"output_dir={tmp_path / 'rerun'}"],
                         progress=False)
  assert objective_from_history(rerun.summary["history"], TEST_ACCURACY, 2) == best["objective"]
  rows = metrics_rows(tmp_path / "rerun")
  assert max(float(row[MAX_STALENESS]) for row in rows) >= 1  # the runs were asynchronous
