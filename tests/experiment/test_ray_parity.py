"""The ray backend gives the in-process backend's numbers bit for bit, model by model.

Each client's kernels run on one thread in every process (`Session`), the
actors run the same compiled client computations over the same batches, and
the server folds their results in client order, so nothing may differ: not the
MLP's, nor the char-LSTM's with its integer inputs. (What a model computes is
in the computations both sides run, so a larger model adds no case: ResNet-18,
whose parity cost over half a minute of the suite, trains through TFF's own
builder in tests/models/test_federated.py.) One local Ray serves the module's
runs (each run's actors are its own). Quickstart's CNN, with its seeded
dropout, is checked the same way in `test_ray_backend` (on actors of two
threads, on a Ray its run starts).
"""

import numpy as np
import pytest

from tests.helpers import saved_weights, tiny
from tff_fedadamom.experiment import run_experiment
from tff_fedadamom.runtime.ray_session import ray_session

RAY = {"backend": "ray", "workers": 2, "cpus_per_worker": 1, "threads": 1}


def _mlp(tmp_path):
  return tiny(tmp_path, model={"name": "mlp"}, data={"name": "mnist5k", "num_clients": 20})


def _char_lstm(tmp_path):
  # Twelve of the plays' roles (`max_clients`): parity holds client by client,
  # and a small held-out set keeps each run's evaluation short.
  return tiny(tmp_path, model={"name": "char_lstm",
                               "options": {"embedding_dim": 8, "lstm_units": 16}},
              data={"name": "shakespeare", "options": {"seq_length": 20, "max_clients": 12}},
              client__clip_norm=10.0)


@pytest.fixture(scope="module")
def local_ray():
  with ray_session(None) as ray:  # started here: the runs use it, and leave it up
    yield ray


# The char-LSTM on one actor (its two clients one after the other), the MLP on
# two: the fold across actors is the same for every model.
# `loop` (the MLP): every client here has at most 2 batches; both sides unroll
# its steps (`algorithms.unrolled`, `unroll_max_batches: 4`), and a third run,
# in-process on TFF's client loop over datasets (`unroll_max_batches: 0`), must
# give the same bits too.
@pytest.mark.parametrize("make,actors,loop", [(_mlp, 2, True), (_char_lstm, 1, False)],
                         ids=["mlp", "char_lstm"])
def test_ray_equals_inprocess_bit_for_bit(tmp_path, local_ray, make, actors, loop):
  raw = make(tmp_path / "data")
  raw["client"] = {**raw["client"], "max_examples": 32, "batch_size": 16}
  raw.update(rounds=2, eval_every=2, checkpoint_every=2)
  runs = {}
  unrolled = {"unroll_max_batches": 4} if loop else {}
  sides = [("inprocess", {"backend": "inprocess", **unrolled}),
           ("ray", {**RAY, "workers": actors, **unrolled})]
  if loop:
    sides.append(("loop", {"backend": "inprocess", "unroll_max_batches": 0}))
  for name, runtime in sides:
    runs[name] = run_experiment({**raw, "output_dir": str(tmp_path / name), "runtime": runtime},
                                progress=False)
  assert runs["ray"].summary["backend"] == "ray"
  assert len(runs["ray"].summary["devices"]) == actors
  assert local_ray.is_initialized()  # the runs joined the module's Ray, as their own
  expected = saved_weights(tmp_path / "inprocess")
  assert len(expected) > 0
  for name, _ in sides[1:]:
    assert runs[name].summary["final_test_loss"] == runs["inprocess"].summary["final_test_loss"]
    actual = saved_weights(tmp_path / name)
    assert len(actual) == len(expected)
    for e, a in zip(expected, actual):
      np.testing.assert_array_equal(a, e)
