"""The pieces that make a round cost its compute: flat computation calls, client
data built in-graph from tensors made once, and thread counts that change no number."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import concrete_function

from tests.helpers import ROOT, tiny
from tff_fedadamom.config import load_config
from tff_fedadamom.data.client_tensors import ClientTensors
from tff_fedadamom.data.preprocess import client_dataset, client_round_seed
from tff_fedadamom.runtime import inprocess
from tff_fedadamom.experiment.process import build_process, load_data


def _batches(dataset):
  return [{k: np.asarray(v) for k, v in b.items()} for b in dataset.as_numpy_iterator()]


def _assert_same_batches(expected, actual):
  assert len(expected) == len(actual) and expected
  for e, a in zip(expected, actual):
    assert e.keys() == a.keys()
    for key in e:
      np.testing.assert_array_equal(e[key], a[key])


@pytest.mark.parametrize("client,data", [
    ({"batch_size": 16}, None),
    ({"batch_size": 7, "local_epochs": 2, "max_examples": 30}, None),
    # uint8 images, converted to float32 in one op rather than per example.
    ({"batch_size": 16, "max_examples": 40}, {"name": "fashion_mnist", "num_clients": 100}),
])
def test_client_tensors_give_the_batches_of_the_client_dataset(tmp_path, client, data):
  """Eagerly and inside a graph, a client's round batches are those of
  `client_dataset` over its `create_tf_dataset_for_client` dataset."""
  overrides = {"data": data} if data else {}
  config = load_config(tiny(tmp_path, client={"learning_rate": 0.1, **client}, **overrides))
  data = load_data(config)
  if overrides:
    assert data.train.client_arrays(data.train.client_ids[0])["x"].dtype == np.uint8
  tensors = ClientTensors(data.train, seed=config.seed, batch_size=config.client.batch_size,
                          local_epochs=config.client.local_epochs,
                          max_examples=config.client.max_examples)

  @tf.function
  def labels_in_graph(*args):
    return tensors.dataset(*args).reduce(
        tf.zeros([0], tf.int32), lambda acc, batch: tf.concat([acc, batch["y"]], 0))

  for cid in data.train.client_ids[:3]:
    source = data.train.create_tf_dataset_for_client(cid)
    if config.client.max_examples is not None:
      source = source.take(config.client.max_examples)
    expected = _batches(client_dataset(
        source, batch_size=config.client.batch_size, local_epochs=config.client.local_epochs,
        seed=client_round_seed(config.seed, 5, cid)))
    _assert_same_batches(expected, _batches(tensors.datasets([cid], 5)[0]))
    np.testing.assert_array_equal(labels_in_graph(*tensors.args(cid, 5)),
                                  np.concatenate([b["y"] for b in expected]))
    # Another round reshuffles.
    other = np.concatenate([b["y"] for b in _batches(tensors.datasets([cid], 6)[0])])
    assert len(other) == sum(len(b["y"]) for b in expected)


def test_computation_calls_skip_the_structured_signature(tmp_path, monkeypatch):
  """A computation call goes straight to the graph: TensorFlow 2.14's structured call
  path formats every argument tensor as text (milliseconds a call)."""
  config = load_config(tiny(tmp_path))
  data = load_data(config)
  from tff_fedadamom.experiment import process as process_lib

  local = inprocess.InProcessLearningProcess(
      build_process(config, data), client_tensors=process_lib.make_client_tensors(config, data))
  state = local.initialize()
  reference = local.next_for_clients(state, data.train.client_ids[:3], 1).state

  def refuse(*args, **kwargs):
    raise AssertionError("a computation call went through the structured signature")

  monkeypatch.setattr(concrete_function.ConcreteFunction, "_call_with_structured_signature",
                      refuse)
  again = local.next_for_clients(state, data.train.client_ids[:3], 1).state
  for a, b in zip(tf.nest.flatten(reference), tf.nest.flatten(again)):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(TypeError, match="next_for_clients"):
    local.next(state, [])
  local.close()


def _describe_run(raw) -> dict:
  """Runs `raw` in this process: its final test accuracy and each weight's sum
  of squares."""
  from tff_fedadamom.experiment import run_experiment

  summary = run_experiment(raw, progress=False).summary
  weights = tf.keras.models.load_model(raw["output_dir"] + "/model.keras").get_weights()
  return {"accuracy": summary["final_test_accuracy"],
          "weights": [float(np.sum(w.astype(np.float64) ** 2)) for w in weights]}


# `_describe_run` in a process of its own, sized to the run's threads first.
_RUN = """
import json, sys
from tff_fedadamom.session import Session
raw = json.loads(sys.argv[1])
Session(threads=raw["runtime"]["threads"]).apply()
from tests.experiment.test_round_speed_parts import _describe_run
print(json.dumps(_describe_run(raw)))
"""


def test_cnn_numbers_do_not_depend_on_threads_or_concurrency(tmp_path):
  """The same CNN config (with seeded dropout) run in a process of 1 thread, one
  client at a time, and in this one, on the test session's threads (one per
  core), with 3 clients at once, gives identical weights."""
  session_threads = tf.config.threading.get_inter_op_parallelism_threads()
  if session_threads < 2:
    pytest.skip("one core: no second thread count to compare")
  out = []
  for threads, concurrent in ((1, 1), (session_threads, 3)):
    raw = tiny(tmp_path / f"t{threads}", rounds=2, eval_every=2, checkpoint_every=2,
               model={"name": "cnn"}, data={"name": "mnist5k", "num_clients": 20},
               client={"learning_rate": 0.05, "batch_size": 16, "max_examples": 32},
               runtime={"threads": threads, "max_concurrent_clients": concurrent})
    if threads > 1:
      out.append(_describe_run(raw))
      continue
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(raw)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    out.append(json.loads(done.stdout.strip().splitlines()[-1]))
  assert out[0] == out[1]
