"""`build_process`'s federated averaging is TFF's `build_weighted_fed_avg`, with
one client work shared by every server optimizer of one model, data signature
and client options."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tests.helpers import state_leaves, tiny
from tff_fedadamom.config import load_config
from tff_fedadamom.optimizers.client import build_client_sgd
from tff_fedadamom.experiment import process as process_lib
from tff_fedadamom.experiment.plan import training_loop

COMPUTATIONS = ("initialize", "next", "get_model_weights", "get_hparams", "set_hparams")


def _config(tmp_path, seed, **overrides):
  # A seed of the test's own: no other test has built this client work.
  return load_config(tiny(tmp_path, seed=seed, **overrides))


def test_fed_avg_is_tffs_builder(tmp_path):
  raw = tiny(tmp_path, seed=1101, model={"name": "mlp", "options": {"hidden": [8]}},
             client__momentum=0.5, client__clip_norm=1.0)
  config = load_config(raw)
  data = process_lib.load_data(config)
  # Another optimizer's process first, so that this one's client work is shared.
  process_lib.build_process(
      load_config({**raw, "server": {"optimizer": "fedavg", "learning_rate": 1.0}}), data)
  ours = process_lib.build_process(config, data)
  client = config.client
  reference = tff.learning.algorithms.build_weighted_fed_avg(
      process_lib.make_model_fn(config, data),
      client_optimizer_fn=build_client_sgd(client.learning_rate, momentum=client.momentum,
                                           weight_decay=client.weight_decay,
                                           clip_norm=client.clip_norm),
      server_optimizer_fn=process_lib.build_server_optimizer(config),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,  # the config's default
      loop_implementation=training_loop(()))
  for name in COMPUTATIONS:
    assert getattr(ours, name).type_signature == getattr(reference, name).type_signature, name
  # From the same state and data, the same results, bit for bit (TFF's runtime runs both).
  state, expected_state = ours.initialize(), reference.initialize()
  for a, e in zip(state_leaves(state), state_leaves(expected_state), strict=True):
    np.testing.assert_array_equal(a, e)
  datasets = process_lib.client_datasets(config, data, data.train.client_ids[:3], 0)
  out, expected = ours.next(state, datasets), reference.next(expected_state, datasets)
  leaves, expected_leaves = state_leaves((out.state, out.metrics)), state_leaves(
      (expected.state, expected.metrics))
  assert len(leaves) == len(expected_leaves) > 0
  for a, e in zip(leaves, expected_leaves):
    np.testing.assert_array_equal(a, e)
  assert not np.array_equal(state_leaves(out.state)[0], state_leaves(state)[0])  # a round did train


@pytest.fixture
def client_work_builds(monkeypatch):
  """A list that gets one entry per client work TFF builds."""
  builds, build = [], tff.learning.templates.build_model_delta_client_work

  def counting(*args, **kwargs):
    builds.append(args)
    return build(*args, **kwargs)

  monkeypatch.setattr(tff.learning.templates, "build_model_delta_client_work", counting)
  return builds


def test_one_client_work_per_model_and_client_options(tmp_path, client_work_builds):
  base = _config(tmp_path, seed=1102)
  data = process_lib.load_data(base)

  def build(**overrides):
    raw = tiny(tmp_path, seed=1102, **overrides)
    return process_lib.build_process(load_config(raw), data)

  fedadamom = build()
  build(server={"optimizer": "fedyogi", "learning_rate": 0.5})
  build(server={"optimizer": "fedavg", "learning_rate": 1.0})
  assert len(client_work_builds) == 1  # three server optimizers, one client work
  # Each process still starts from its own hparams.
  assert fedadamom.get_hparams(fedadamom.initialize())["client_work"]["learning_rate"] == \
      pytest.approx(0.1)
  other_lr = build(client__learning_rate=0.05)
  assert len(client_work_builds) == 2  # the client learning rate is the client work's
  assert other_lr.get_hparams(other_lr.initialize())["client_work"]["learning_rate"] == \
      pytest.approx(0.05)
  build(model={"name": "mlp", "options": {"hidden": [4]}})
  build(client__clip_norm=1.0)
  assert len(client_work_builds) == 4  # so are the model and the client's options


def test_cached_builds_share_the_client_work_whatever_the_client_rate(tmp_path,
                                                                      client_work_builds):
  """A compiled process is built at the default client learning rate (the
  state holds the rate; `initial_state` sets each config's), so the rates a
  sweep samples share one client work."""
  from tff_fedadamom.experiment import parts

  states = []
  for optimizer, rate in (("fedavg", 0.05), ("fedyogi", 0.2)):
    raw = tiny(tmp_path / optimizer, seed=1103, client__learning_rate=rate,
               server={"optimizer": optimizer, "learning_rate": 1.0},
               runtime={"cache": False})
    plan = parts.make_plan(raw)
    built = parts.build_parts(plan)
    states.append(built.process.get_hparams(parts.initial_state(plan, built.process)))
    built.process.close()
  assert len(client_work_builds) == 1
  assert [s["client_work"]["learning_rate"] for s in states] == \
      [pytest.approx(0.05), pytest.approx(0.2)]
