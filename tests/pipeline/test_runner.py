"""The runner end to end on tiny real data (digits, logistic model)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.pipeline import build_process, run_experiment
from tff_fedadamom.pipeline import outputs
from tff_fedadamom.pipeline.process import load_data
from tff_fedadamom.pipeline.runner import sample_clients

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def tiny(output_dir, **overrides):
  raw = {
      "seed": 3, "rounds": 4, "clients_per_round": 3, "eval_every": 2,
      "checkpoint_every": 1, "output_dir": str(output_dir), "targets": [0.3, 0.99],
      "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "dirichlet",
                                                                 "alpha": 0.5}},
      "model": {"name": "logistic"},
      "client": {"learning_rate": 0.1, "batch_size": 16},
      "server": {"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.1},
  }
  for key, value in overrides.items():
    section, _, field = key.partition("__")
    if field:
      raw[section] = {**raw[section], field: value}
      if value is None:
        del raw[section][field]
    else:
      raw[key] = value
  return raw


def _weights(output_dir):
  model = tf.keras.models.load_model(os.path.join(output_dir, outputs.MODEL_FILE))
  return [w.numpy() for w in model.weights]


def test_run_writes_every_output(tmp_path):
  events = []
  result = run_experiment(tiny(tmp_path / "run"), on_eval=events.append, progress=False)
  out = result.output_dir
  for name in (outputs.CONFIG_FILE, outputs.METRICS_FILE, outputs.SUMMARY_FILE,
               outputs.MODEL_FILE, outputs.CURVES_FILE):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  assert os.listdir(os.path.join(out, outputs.TENSORBOARD_DIR))
  summary = json.load(open(os.path.join(out, outputs.SUMMARY_FILE)))
  assert summary["status"] == "completed"
  assert summary["rounds_completed"] == 4
  assert [e.round_num for e in events] == [2, 4]
  assert 0 < summary["final_test_accuracy"] <= 1
  assert summary["final_test_accuracy"] == events[-1].metrics["test/accuracy"]
  assert summary["rounds_to_target"]["0.99"] is None
  assert summary["devices"]
  rows = outputs.read_metrics(out)
  assert [r["round"] for r in rows] == [1, 2, 3, 4]
  assert all(np.isfinite(r["train/loss"]) for r in rows)
  assert "opt/beta1_mean" in rows[0]
  # The saved config is a complete config that loads as is.
  assert load_config(os.path.join(out, outputs.CONFIG_FILE)).rounds == 4


def test_resumed_run_equals_uninterrupted_run(tmp_path):
  full = run_experiment(tiny(tmp_path / "full"), progress=False)
  run_experiment(tiny(tmp_path / "split", rounds=2), progress=False)
  resumed = run_experiment(tiny(tmp_path / "split"), progress=False)
  assert resumed.summary["resumed_from_round"] == 2
  assert resumed.summary["final_test_accuracy"] == full.summary["final_test_accuracy"]
  assert resumed.summary["final_train_loss"] == full.summary["final_train_loss"]
  for a, b in zip(_weights(full.output_dir), _weights(resumed.output_dir)):
    np.testing.assert_array_equal(a, b)
  rows = outputs.read_metrics(resumed.output_dir)
  assert [r["round"] for r in rows] == [1, 2, 3, 4]


def test_rerunning_a_finished_run_changes_nothing(tmp_path):
  first = run_experiment(tiny(tmp_path / "run", rounds=2), progress=False)
  again = run_experiment(tiny(tmp_path / "run", rounds=2), progress=False)
  assert again.summary == first.summary


def test_other_config_in_same_output_dir_is_refused(tmp_path):
  run_experiment(tiny(tmp_path / "run", rounds=1), progress=False)
  with pytest.raises(ConfigError, match="server.beta_2.*different config"):
    run_experiment(tiny(tmp_path / "run", rounds=1, server__beta_2=0.2), progress=False)


def test_diverging_learning_rate_stops_with_status(tmp_path):
  result = run_experiment(
      tiny(tmp_path / "run", rounds=6, server__optimizer="fedavg",
           server__learning_rate=1e38, server__beta_2=None),
      progress=False)
  assert result.summary["status"] == "diverged"
  assert 1 <= result.summary["diverged_round"] < 6
  assert not os.path.exists(os.path.join(result.output_dir, outputs.MODEL_FILE))


def test_unwritable_output_dir_fails_before_training(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(OSError, match="not writable"):
    run_experiment(tiny(blocker / "run"), progress=False)


def test_sample_clients_is_a_function_of_seed_and_round():
  ids = [f"c{i}" for i in range(20)]
  a = sample_clients(ids, 5, seed=1, round_num=7)
  assert a == sample_clients(ids, 5, seed=1, round_num=7)
  assert len(set(a)) == 5
  assert a != sample_clients(ids, 5, seed=1, round_num=8)
  assert a != sample_clients(ids, 5, seed=2, round_num=7)


def _one_round(config):
  data = load_data(config)
  process = build_process(config, data)
  from tff_fedadamom.pipeline.process import client_datasets

  state = process.initialize()
  datasets = client_datasets(config, data, data.train.client_ids[:3], 1)
  state = process.next(state, datasets).state
  return process, [np.asarray(w) for w in process.get_model_weights(state).trainable]


def test_client_weighting_is_honoured(tmp_path):
  base = tiny(tmp_path, data__partition={"kind": "dirichlet", "alpha": 0.1})
  _, uniform = _one_round(load_config(base))
  _, weighted = _one_round(load_config(base, ["server.client_weighting=num_examples"]))
  assert not np.allclose(uniform[0], weighted[0])


def test_client_lr_decay_uses_the_schedule_variant(tmp_path):
  config = load_config(tiny(tmp_path), ["client.lr_decay=0.5", "client.weight_decay=0.001",
                                        "client.clip_norm=1.0", "client.momentum=0.5"])
  process, weights = _one_round(config)
  assert isinstance(process, tff.learning.templates.LearningProcess)
  assert all(np.all(np.isfinite(w)) for w in weights)


def test_cli_run_and_validate_leave_no_child_process(tmp_path):
  config = tmp_path / "c.yaml"
  import yaml

  config.write_text(yaml.safe_dump(tiny(tmp_path / "cli", rounds=2)))
  env = {**os.environ, "PYTHONPATH": ROOT}
  bad = subprocess.run([sys.executable, "-m", "tff_fedadamom", "validate", str(config),
                        "--set", "server.beta_2=7"], capture_output=True, text=True, env=env,
                       timeout=300)
  assert bad.returncode == 2
  assert "server.beta_2" in bad.stderr and "[0.0, 1.0]" in bad.stderr
  run = subprocess.Popen([sys.executable, "-m", "tff_fedadamom", "run", str(config),
                          "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
  stdout, stderr = run.communicate(timeout=300)
  assert run.returncode == 0, stderr
  assert "completed: 2 rounds" in stdout
  leftovers = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True)
  assert leftovers.stdout.strip() == ""
  # communicate() returned, so no child held the pipes open after exit.


def test_same_config_same_weights_with_dropout(tmp_path):
  """The CNN has dropout: a run is still a function of its config alone."""
  results = []
  for name in ("a", "b"):
    raw = tiny(tmp_path / name, rounds=2, model={"name": "cnn"},
               data={"name": "mnist5k", "num_clients": 20})
    raw["client"]["max_examples"] = 40
    run_experiment(raw, progress=False)
    results.append(_weights(tmp_path / name))
  for a, b in zip(*results):
    np.testing.assert_array_equal(a, b)
