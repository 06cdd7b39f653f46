"""The runner end to end on tiny real data (digits, logistic model)."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests.helpers import ROOT, saved_weights, tiny
from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.metric_names import TEST_ACCURACY, TRAIN_LOSS
from tff_fedadamom.experiment import build_process, run_experiment
from tff_fedadamom.experiment import outputs
from tff_fedadamom.experiment.process import client_datasets, load_data

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
  assert summary["final_test_accuracy"] == events[-1].metrics[TEST_ACCURACY]
  assert summary["rounds_to_target"]["0.99"] is None
  assert summary["devices"]
  rows = outputs.read_metrics(out)
  assert [r["round"] for r in rows] == [1, 2, 3, 4]
  assert all(np.isfinite(r[TRAIN_LOSS]) for r in rows)
  assert "opt/beta1_mean" in rows[0]
  # The saved config is a complete config that loads as is.
  assert load_config(os.path.join(out, outputs.CONFIG_FILE)).rounds == 4


def test_saved_model_loads_compiled_and_without_warnings(tmp_path, run_shared, caplog):
  """model.keras loads with the task's loss and metrics, evaluates to the run's
  final test accuracy, and Keras logs nothing about its optimizer's variables."""
  run = run_shared(tiny(tmp_path / "run", rounds=2))
  with caplog.at_level("WARNING"):
    model = tf.keras.models.load_model(os.path.join(run.output_dir, outputs.MODEL_FILE))
  assert not [r.getMessage() for r in caplog.records if "variable" in r.getMessage()]
  test = load_data(load_config(tiny(tmp_path / "run", rounds=2))).test
  _, accuracy = model.evaluate(test.batch(1000).map(lambda e: (e["x"], e["y"])), verbose=0)
  assert accuracy == pytest.approx(run.summary["final_test_accuracy"], abs=1e-6)


_EVALUATE_WITH_PLAIN_KERAS = """
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
model = tf.keras.models.load_model(sys.argv[1])
x, y = np.load(sys.argv[2]), np.load(sys.argv[3])
print(model.evaluate(x, y, batch_size=1000, verbose=0)[1])
"""


def test_a_seeded_cnns_saved_model_loads_with_plain_keras(tmp_path, run_shared):
  """A seeded CNN's model.keras (its dropout is the project's layer while it
  trains) loads in a process that imported TensorFlow alone, and evaluates
  there to the run's final test accuracy."""
  raw = tiny(tmp_path / "run", rounds=2, model={"name": "cnn"})
  run = run_shared(raw)
  test = next(iter(load_data(load_config(raw)).test.batch(1 << 20)))
  for name in ("x", "y"):
    np.save(tmp_path / f"{name}.npy", test[name].numpy())
  done = subprocess.run(
      [sys.executable, "-c", _EVALUATE_WITH_PLAIN_KERAS,
       os.path.join(run.output_dir, outputs.MODEL_FILE), str(tmp_path / "x.npy"),
       str(tmp_path / "y.npy")],
      cwd=tmp_path, capture_output=True, text=True, timeout=300,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert done.returncode == 0, done.stderr[-2000:]
  accuracy = float(done.stdout.split()[-1])
  assert accuracy == pytest.approx(run.summary["final_test_accuracy"], abs=1e-6)


def test_resumed_run_equals_uninterrupted_run(tmp_path, run_shared):
  full = run_shared(tiny(tmp_path / "full"))
  run_shared(tiny(tmp_path / "split", rounds=2))
  resumed = run_shared(tiny(tmp_path / "split"))
  assert resumed.summary["resumed_from_round"] == 2
  assert resumed.summary["final_test_accuracy"] == full.summary["final_test_accuracy"]
  assert resumed.summary["final_train_loss"] == full.summary["final_train_loss"]
  for a, b in zip(saved_weights(full.output_dir), saved_weights(resumed.output_dir), strict=True):
    np.testing.assert_array_equal(a, b)
  rows = outputs.read_metrics(resumed.output_dir)
  assert [r["round"] for r in rows] == [1, 2, 3, 4]


def test_rerunning_a_finished_run_changes_nothing(tmp_path, run_shared):
  first = run_shared(tiny(tmp_path / "run", rounds=2))
  again = run_shared(tiny(tmp_path / "run", rounds=2))
  assert again.summary == first.summary


def test_a_run_without_model_and_plot_has_the_same_summary_and_metrics(tmp_path, run_shared):
  """A sweep trial's run (`model_and_plot=False`) writes neither the model nor
  the plot; its metrics rows and summary are those of a run that does."""
  full = run_shared(tiny(tmp_path / "full", rounds=2))
  bare = run_shared(tiny(tmp_path / "bare", rounds=2), model_and_plot=False)
  for name in (outputs.MODEL_FILE, outputs.CURVES_FILE):
    assert os.path.exists(os.path.join(full.output_dir, name))
    assert not os.path.exists(os.path.join(bare.output_dir, name))
  def untimed(rows):
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]

  assert (untimed(outputs.read_metrics(bare.output_dir))
          == untimed(outputs.read_metrics(full.output_dir)))
  timing = ("wall_time_s", "rounds_per_second")
  assert ({k: v for k, v in bare.summary.items() if k not in timing}
          == {k: v for k, v in full.summary.items() if k not in timing})
  with open(os.path.join(bare.output_dir, outputs.SUMMARY_FILE)) as f:
    assert json.load(f)["status"] == "completed"


def test_other_config_in_same_output_dir_is_refused(tmp_path, run_shared):
  run_shared(tiny(tmp_path / "run", rounds=1))
  with pytest.raises(ConfigError, match="server.beta_2.*different config"):
    run_shared(tiny(tmp_path / "run", rounds=1, server__beta_2=0.2))


def test_a_validated_config_runs_without_a_second_validation(tmp_path, monkeypatch):
  """A caller that holds a validated config (a sweep worker, `compare`, the CLI)
  hands it to `run_experiment`, which runs it as it is: nothing on the way
  turns it back into a mapping and asks the registries again."""
  from tff_fedadamom.config import loader

  config = load_config(tiny(tmp_path / "run", rounds=1, eval_every=1))

  def refuse(*args):
    raise AssertionError("validated again")

  monkeypatch.setattr(loader, "check_registries", refuse)
  result = run_experiment(config, progress=False)
  assert result.summary["status"] == "completed"
  with pytest.raises(AssertionError, match="validated again"):  # the patch does catch one
    run_experiment(tiny(tmp_path / "other", rounds=1), progress=False)


@pytest.fixture
def optimizer_builds(monkeypatch):
  """A list that gets one entry per build of a server optimizer through the
  registry (the function the pipeline builds every server optimizer with)."""
  from tff_fedadamom import methods as registry

  builds, build = [], registry.build_server_optimizer

  def counting(*args, **kwargs):
    builds.append(args[:1])
    return build(*args, **kwargs)

  monkeypatch.setattr(registry, "build_server_optimizer", counting)
  return builds


def test_a_run_builds_its_server_optimizer_once(tmp_path, optimizer_builds):
  """The run plan is made once per run (`parts.make_plan`) and builds the server
  optimizer once: the state-held hparams are read from it, the process is
  built with it, and the structure key and the initial state read the plan.
  Cold (the run builds its parts, with no process cache to skip the build) and
  warm (parts from a `PartsCache`, for this config's plan or for another
  config of the same structure), the optimizer is built at most once."""
  from tff_fedadamom.experiment import parts as parts_lib
  from tff_fedadamom.experiment import parts_cache

  def raw(name, **overrides):
    return tiny(tmp_path / name, rounds=1, eval_every=1, runtime={"cache": False},
                **overrides)

  config = load_config(raw("cold"))
  assert optimizer_builds == []  # validation checks hparams without building
  cold = run_experiment(config, progress=False)
  assert len(optimizer_builds) <= 1, optimizer_builds

  del optimizer_builds[:]
  cache = parts_cache.PartsCache()
  plan = parts_lib.make_plan(load_config(raw("warm")))
  parts = cache.get(plan)
  warm = run_experiment(plan, parts=parts, progress=False)
  assert len(optimizer_builds) <= 1, optimizer_builds  # the plan's, for the cache and the run

  del optimizer_builds[:]
  other = load_config(raw("other", server__learning_rate=0.5))  # held in the state
  assert cache.get(other) is parts
  del optimizer_builds[:]
  run_experiment(other, parts=parts, progress=False)
  assert len(optimizer_builds) <= 1, optimizer_builds
  assert cold.summary["final_train_loss"] == warm.summary["final_train_loss"]
  for a, b in zip(saved_weights(cold.output_dir), saved_weights(warm.output_dir), strict=True):
    np.testing.assert_array_equal(a, b)


def test_diverging_learning_rate_stops_with_status(tmp_path):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = run_experiment(
        tiny(tmp_path / "run", rounds=6, server__optimizer="fedavg",
             server__learning_rate=1e38, server__beta_2=None),
        progress=False)
  # The status says it; numpy's overflow warnings would only repeat it.
  assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
  assert result.summary["status"] == "diverged"
  assert 1 <= result.summary["diverged_round"] < 6
  assert not os.path.exists(os.path.join(result.output_dir, outputs.MODEL_FILE))


def test_unwritable_output_dir_fails_before_training(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(OSError, match="not writable"):
    run_experiment(tiny(blocker / "run"), progress=False)


def _one_round(config):
  data = load_data(config)
  process = build_process(config, data)
  state = process.initialize()
  datasets = client_datasets(config, data, data.train.client_ids[:3], 1)
  state = process.next(state, datasets).state
  return [np.asarray(w) for w in process.get_model_weights(state).trainable]


def test_client_weighting_is_honoured(tmp_path):
  base = tiny(tmp_path, data__partition={"kind": "dirichlet", "alpha": 0.1})
  uniform = _one_round(load_config(base))
  weighted = _one_round(load_config(base, ["server.client_weighting=num_examples"]))
  assert not np.allclose(uniform[0], weighted[0])


def _round_deltas(config, rounds):
  """Each round's change of the weights, every round started from the initial ones
  on the same client batches: round r moves them by -eta_r * G, G fixed."""
  data = load_data(config)
  process = build_process(config, data)
  datasets = client_datasets(config, data, data.train.client_ids[:3], 1)
  state = process.initialize()
  initial = process.get_model_weights(state)
  deltas = []
  for _ in range(rounds):
    state = process.next(state, datasets).state
    after = process.get_model_weights(state).trainable
    deltas.append([np.asarray(a) - np.asarray(b) for a, b in zip(after, initial.trainable)])
    state = process.set_model_weights(state, initial)
  return process, deltas


def test_client_lr_decay_uses_the_schedule_variant(tmp_path):
  # The client learning rate of round r (counted from 0) is eta_l * lr_decay ** r:
  # 0.1, 0.05, 0.025. One local step per client (one batch, SGD's first step is
  # plain with momentum too; clipping and coupled weight decay act on the gradient)
  # and FedAvg's server step of 1 make a round's change -eta_r * G, G the same
  # every round from the same weights and batches. So each round's change is
  # eta_r / eta_l times that of a run whose client rate does not decay.
  one_step = ["server.optimizer=fedavg", "server.learning_rate=1.0", "client.max_examples=16",
              "client.weight_decay=0.001", "client.clip_norm=1.0", "client.momentum=0.5"]
  raw = tiny(tmp_path, server__beta_2=None)
  expected_lrs = [0.1, 0.05, 0.025]
  process, decayed = _round_deltas(load_config(raw, one_step + ["client.lr_decay=0.5"]), 3)
  assert isinstance(process, tff.learning.templates.LearningProcess)
  assert all(np.all(np.isfinite(d)) for delta in decayed for d in delta)
  _, constant = _round_deltas(load_config(raw, one_step), 1)
  assert np.abs(constant[0][0]).max() > 1e-3  # the round moves the weights
  for lr, delta in zip(expected_lrs, decayed, strict=True):
    for got, reference in zip(delta, constant[0], strict=True):
      np.testing.assert_allclose(got, lr / 0.1 * reference, rtol=1e-3, atol=1e-6)


# Runs a command with this interpreter as its "child subreaper" (prctl(2)): a
# process the command leaves behind is re-parented here, not to init, when the
# command exits. Once the command has exited, its leftovers are this process's
# children: they are listed, killed, and reported with the command's outcome.
_REAPER = textwrap.dedent("""
    import ctypes, json, os, signal, subprocess, sys, time

    PR_SET_CHILD_SUBREAPER = 36
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
      raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    report = {"timed_out": False}
    try:
      done = subprocess.run(sys.argv[3:], capture_output=True, text=True,
                            timeout=float(sys.argv[1]))
      report.update(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr)
    except subprocess.TimeoutExpired:  # a leftover held the pipes open
      report["timed_out"] = True

    def children():
      while True:  # reap the leftovers that have ended
        try:
          if os.waitpid(-1, os.WNOHANG)[0] == 0:
            break
        except ChildProcessError:
          break
      found = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True,
                             text=True)  # pgrep never lists itself
      return [int(pid) for pid in found.stdout.split()]

    deadline = time.time() + float(sys.argv[2])  # for a process killed at exit to end
    while children() and time.time() < deadline:
      time.sleep(0.1)
    report["leftovers"] = children()
    for pid in report["leftovers"]:
      os.kill(pid, signal.SIGKILL)
    print(json.dumps(report))
""")


def _run_reaped(argv, env=None, timeout=300, grace=10):
  """Runs `argv`; its outcome and the pids of the processes it left running
  `grace` seconds after it exited."""
  done = subprocess.run([sys.executable, "-c", _REAPER, str(timeout), str(grace), *argv],
                        capture_output=True, text=True, env=env, timeout=timeout + 60)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout)


def test_leftover_check_sees_a_process_left_running():
  # A second's grace: the leftover sleeps for minutes.
  report = _run_reaped(["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo started"], timeout=60,
                       grace=1)
  assert report["returncode"] == 0 and report["stdout"] == "started\n"
  assert len(report["leftovers"]) == 1


def test_cli_run_and_validate_leave_no_child_process(tmp_path):
  config = tmp_path / "c.yaml"
  import yaml

  config.write_text(yaml.safe_dump(tiny(tmp_path / "cli", rounds=2)))
  env = {**os.environ, "PYTHONPATH": ROOT}
  bad = _run_reaped([sys.executable, "-m", "tff_fedadamom", "validate", str(config),
                     "--set", "server.beta_2=7"], env=env)
  assert bad["returncode"] == 2
  assert "server.beta_2" in bad["stderr"] and "[0.0, 1.0]" in bad["stderr"]
  assert bad["leftovers"] == []
  run = _run_reaped([sys.executable, "-m", "tff_fedadamom", "run", str(config), "--quiet"],
                    env=env)
  # Not timed out: no process held the run's pipes open after it exited.
  assert not run["timed_out"]
  assert run["returncode"] == 0, run["stderr"]
  assert "completed: 2 rounds" in run["stdout"]
  assert run["leftovers"] == []


def test_same_config_same_weights_with_dropout(tmp_path):
  """The CNN has dropout: a run is still a function of its config alone."""
  results = []
  for name in ("a", "b"):
    raw = tiny(tmp_path / name, rounds=2, model={"name": "cnn"},
               data={"name": "mnist5k", "num_clients": 20})
    raw["client"]["max_examples"] = 40
    run_experiment(raw, progress=False)
    results.append(saved_weights(tmp_path / name))
  for a, b in zip(*results):
    np.testing.assert_array_equal(a, b)
