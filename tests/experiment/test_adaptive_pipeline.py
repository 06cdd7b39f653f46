"""FADAS, FedAMSGrad and bias_correction through configs, processes and runs."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
import yaml

from tests.helpers import tiny
from tff_fedadamom.config import ConfigError, dump_config, load_config
from tff_fedadamom import methods as registry
from tff_fedadamom.experiment import build_process, outputs, run_experiment
from tff_fedadamom.experiment import telemetry
from tff_fedadamom.experiment.compare import optimizer_variant
from tff_fedadamom.experiment.process import client_datasets, load_data

# The new update rules: the two new optimizers and the other bias-correction
# convention of each Adam-family optimizer.
NEW_RULES = [
    {"optimizer": "fadas"},
    {"optimizer": "fedamsgrad"},
    {"optimizer": "fadas", "bias_correction": False},
    {"optimizer": "fedamsgrad", "bias_correction": False},
    {"optimizer": "fedadam", "bias_correction": False},
    {"optimizer": "fedyogi", "bias_correction": False},
]


def _config(tmp_path, server, **overrides):
  raw = tiny(tmp_path / "run", **overrides)
  raw["server"] = dict(server)
  return raw


def test_fadas_config_validates_with_its_defaults(tmp_path):
  config = load_config(_config(tmp_path, {"optimizer": "fadas"}))
  assert config.server.hparams == registry.default_hparams("fadas")
  assert config.server.hparams["bias_correction"] is True  # as yujiaw98/FADAS' update.py
  assert config.server.hparams["delay_threshold"] == 1.0


def test_bias_correction_from_yaml_and_override_survives_round_trip(tmp_path):
  path = tmp_path / "c.yaml"
  raw = _config(tmp_path, {"optimizer": "fedadam", "bias_correction": False})
  path.write_text(yaml.safe_dump(raw))
  config = load_config(str(path))
  assert config.server.hparams["bias_correction"] is False
  again = load_config(yaml.safe_load(dump_config(config)))
  assert again.server.hparams["bias_correction"] is False
  assert "bias_correction: false" in dump_config(config)
  flipped = load_config(str(path), ["server.bias_correction=true"])
  assert flipped.server.hparams["bias_correction"] is True
  # fedadam's default is TFF's bias-corrected Adam, as before.
  assert load_config(_config(tmp_path, {"optimizer": "fedadam"})).server.hparams[
      "bias_correction"] is True


@pytest.mark.parametrize("value", [0, 1, 1.0, "no", "false", [True]])
def test_non_bool_bias_correction_is_a_config_error(tmp_path, value):
  with pytest.raises(ConfigError) as info:
    load_config(_config(tmp_path, {"optimizer": "fadas", "bias_correction": value}))
  assert info.value.field == "server.bias_correction"
  assert "true or false" in str(info.value)


def test_bias_correction_is_unknown_where_the_optimizer_has_none(tmp_path):
  with pytest.raises(ConfigError, match="server.bias_correction.*unknown key"):
    load_config(_config(tmp_path, {"optimizer": "fedavg", "bias_correction": False}))


def test_bool_for_a_number_is_still_a_config_error(tmp_path):
  with pytest.raises(ConfigError, match="server.epsilon.*a finite number"):
    load_config(_config(tmp_path, {"optimizer": "fadas", "epsilon": True}))


def test_fadas_out_of_range_hparam_names_the_field(tmp_path):
  with pytest.raises(ConfigError) as info:
    load_config(_config(tmp_path, {"optimizer": "fadas", "delay_threshold": -1.0}))
  assert info.value.field == "server.delay_threshold"


@pytest.mark.parametrize("server", NEW_RULES,
                         ids=lambda s: "-".join(map(str, s.values())))
def test_process_runs_a_round_and_compiles_to_mapreduce(tmp_path, server):
  config = load_config(_config(tmp_path, server))
  data = load_data(config)
  process = build_process(config, data)
  assert isinstance(process, tff.learning.templates.LearningProcess)
  form = tff.backends.mapreduce.get_map_reduce_form_for_computation(process.next)
  assert isinstance(form, tff.backends.mapreduce.MapReduceForm)
  state = process.initialize()
  datasets = client_datasets(config, data, data.train.client_ids[:3], 1)
  before = [np.asarray(w) for w in process.get_model_weights(state).trainable]
  state = process.next(state, datasets).state
  after = [np.asarray(w) for w in process.get_model_weights(state).trainable]
  assert all(np.all(np.isfinite(w)) for w in after)
  assert not all(np.array_equal(a, b) for a, b in zip(before, after))
  # The server optimizer's hparams are in the process state, for sweeps; a
  # switch such as bias_correction is not (it is built in).
  finalizer = process.get_hparams(state)["finalizer"]
  assert finalizer["learning_rate"] == pytest.approx(
      config.server.hparams["learning_rate"])
  assert "bias_correction" not in finalizer
  if server["optimizer"] == "fadas":
    assert finalizer["max_delay"] == 0.0  # synchronous rounds


def test_short_fadas_run_trains(tmp_path):
  raw = _config(tmp_path, {"optimizer": "fadas", "learning_rate": 0.03},
                rounds=2, eval_every=1)
  result = run_experiment(raw, progress=False)
  assert result.summary["status"] == "completed"
  rows = outputs.read_metrics(result.output_dir)
  assert [r["round"] for r in rows] == [1, 2]
  assert rows[1]["train/loss"] < rows[0]["train/loss"]
  assert result.summary["final_test_accuracy"] > 0.2  # 10 classes: chance is 0.1
  for key in ("opt/v_mean", "opt/vhat_mean", "opt/vhat_p99", "opt/momentum_norm"):
    assert np.isfinite(rows[1][key]), key
  assert rows[1]["opt/learning_rate"] == pytest.approx(0.03)


def test_telemetry_reads_the_amsgrad_maximum():
  opt = registry.build_server_optimizer("fadas", learning_rate=0.1, beta_2=0.5)
  weights = [tf.constant([[1.0, -2.0], [0.5, 3.0]]), tf.constant([0.1, -0.1])]
  state = opt.initialize([tf.TensorSpec(t.shape, t.dtype) for t in weights])
  for scale in (1.0, 0.1):  # the second, smaller update lowers v below v_hat
    grads = [scale * tf.constant([[0.3, -1.0], [2.0, 0.0]]),
             scale * tf.constant([0.5, -0.2])]
    state, weights = opt.next(state, weights, grads)
  state = tf.nest.map_structure(np.asarray, state)
  stats = telemetry.optimizer_state_stats(state, layer_names=["k", "b"])
  vhat = np.concatenate([np.ravel(x) for x in state["max_preconditioner"]])
  v = np.concatenate([np.ravel(x) for x in state["preconditioner"]])
  assert np.all(vhat >= v) and np.any(vhat > v)
  assert stats["opt/vhat_mean"] == pytest.approx(vhat.mean())
  for name, q in (("p01", 1), ("median", 50), ("p99", 99)):
    assert stats[f"opt/vhat_{name}"] == pytest.approx(np.percentile(vhat, q))
    assert stats[f"opt/v_{name}"] == pytest.approx(np.percentile(v, q))
  assert "fedadamom" not in registry.optimizers_of_state(state)
  assert not any("beta1" in k for k in stats)
  hist = telemetry.state_histograms(state)
  assert set(hist) == {"opt/v", "opt/vhat"}
  np.testing.assert_array_equal(hist["opt/vhat"], vhat)


def test_compare_variant_gets_the_new_optimizers_defaults(tmp_path):
  base = load_config(tiny(tmp_path / "v"))
  variant = optimizer_variant(base, "fadas")
  assert variant.server.hparams == registry.default_hparams("fadas")
