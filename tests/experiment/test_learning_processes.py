"""FedCAda and FAFED through the pipeline: config, training, telemetry, resume, compare.

`tiny()` samples 3 of 8 clients per round, so FAFED runs with partial
participation here.
"""

import numpy as np
import pytest

from tests.helpers import saved_weights, tiny
from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.experiment import build_process, outputs
from tff_fedadamom.experiment.compare import compare, optimizer_variant

# Adam-like client steps want a smaller client learning rate than SGD's 0.1.
SERVER = {
    "fedcada": {"optimizer": "fedcada", "learning_rate": 1.0},
    "fafed": {"optimizer": "fafed", "learning_rate": 1.0, "epsilon": 0.05},
}
CLIENT = {"learning_rate": 0.02, "batch_size": 16, "lr_decay": 0.99, "clip_norm": 10.0,
          "weight_decay": 1e-4}


def _config(name, output_dir, **overrides):
  return tiny(output_dir, server=SERVER[name], client=CLIENT, **overrides)


@pytest.mark.parametrize("name", sorted(SERVER))
def test_trains_records_telemetry_and_resumes_bit_identically(name, tmp_path, run_shared):
  full = run_shared(_config(name, tmp_path / "full"))
  assert full.summary["status"] == "completed"
  rows = outputs.read_metrics(full.output_dir)
  assert rows[-1]["train/loss"] < rows[0]["train/loss"]
  assert all(r["nonfinite_updates"] == 0 for r in rows)
  # The server's state: its learning rate and the averaged moments.
  assert rows[-1]["opt/learning_rate"] == 1.0
  assert rows[-1]["opt/v_median"] > 0 and rows[-1]["opt/momentum_norm"] > 0
  assert rows[-1]["opt/update_norm"] > 0
  assert "opt/beta1_mean" not in rows[-1]

  run_shared(_config(name, tmp_path / "split", rounds=2))
  resumed = run_shared(_config(name, tmp_path / "split"))
  assert resumed.summary["resumed_from_round"] == 2
  assert resumed.summary["final_train_loss"] == full.summary["final_train_loss"]
  assert resumed.summary["final_test_accuracy"] == full.summary["final_test_accuracy"]
  for a, b in zip(saved_weights(full.output_dir), saved_weights(resumed.output_dir), strict=True):
    np.testing.assert_array_equal(a, b)
  for key in ("opt/v_median", "opt/momentum_norm"):
    assert outputs.read_metrics(resumed.output_dir)[-1][key] == rows[-1][key]


@pytest.mark.parametrize("name", sorted(SERVER))
def test_config_builds_the_process_with_its_hparams(name, tmp_path):
  config = load_config(_config(name, tmp_path / "c", server__learning_rate=0.5))
  process = build_process(config)
  state = process.initialize()
  hparams = process.get_hparams(state)
  assert hparams["finalizer"]["learning_rate"] == pytest.approx(0.5)
  assert hparams["client_work"]["learning_rate"] == pytest.approx(0.02)
  assert hparams["client_work"]["lr_decay"] == pytest.approx(0.99)
  assert process.get_model_weights(state).trainable


@pytest.mark.parametrize("name", sorted(SERVER))
@pytest.mark.parametrize("override, field", [
    ({"client__momentum": 0.9}, "client.momentum"),
    ({"server__schedule": {"kind": "cosine", "decay_rounds": 10}}, "server.schedule"),
    ({"server__momentum": 0.9}, "server.momentum"),
    ({"server__epsilon": -1.0}, "server.epsilon"),
])
def test_config_errors_name_the_field(name, override, field, tmp_path):
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    load_config(_config(name, tmp_path / "e", **override))


def test_compare_accepts_the_names_and_prints_communication(tmp_path):
  base = load_config(tiny(tmp_path / "v"))
  variant = optimizer_variant(base, "fafed")
  # FAFED's defaults: naya0000/FaFed's main.py (alpha = beta = rho = 0.1).
  assert variant.server.hparams == {"learning_rate": 1.0, "alpha": 0.1, "beta_2": 0.1,
                                    "epsilon": 0.1}
  table = compare(tiny(tmp_path / "cmp", rounds=1, client=CLIENT), ["fedavg", "fedcada"],
                  progress=False)
  header, _, *rows = table.splitlines()
  column = [c.strip() for c in header.split("|")].index("communication_x_fedavg")
  assert {r.split("|")[1].strip(): r.split("|")[column].strip() for r in rows} == {
      "fedavg": "1.0000", "fedcada": "3.0000"}
