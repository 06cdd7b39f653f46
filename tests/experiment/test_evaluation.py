"""The evaluator gives Keras' `model.evaluate` numbers bit for bit, its batches
run side by side: for a linear model, the CNN and the char-LSTM (whose accuracy
is masked), with a partial last batch, whatever the number of threads."""

import numpy as np
import pytest
import tensorflow as tf

from tests.helpers import tiny
from tff_fedadamom.config import load_config
from tff_fedadamom.metric_names import LOSS, TEST_ACCURACY, TEST_LOSS
from tff_fedadamom.models import ACCURACY_METRIC
from tff_fedadamom.experiment import evaluation
from tff_fedadamom.experiment import process as process_lib
from tff_fedadamom.runtime import inprocess

CASES = {
    "logistic": dict(data={"name": "digits", "num_clients": 8, "eval_batch_size": 50}),
    "cnn": dict(model={"name": "cnn"},
                data={"name": "mnist5k", "num_clients": 8, "eval_batch_size": 96}),
    "char_lstm": dict(model={"name": "char_lstm",
                             "options": {"embedding_dim": 4, "lstm_units": 8}},
                      data={"name": "shakespeare", "options": {"max_clients": 5, "seq_length": 10},
                            "eval_batch_size": 70}),
}


class _Weights:
  """What a process's `get_model_weights` gives: weights to assign to a model."""

  def __init__(self, weights):
    self._weights = weights

  def assign_weights_to(self, model):
    model.set_weights(self._weights)


class _Process:
  def get_model_weights(self, state):
    return _Weights(state)


def _keras_evaluate(model, data, batch_size):
  from tff_fedadamom.data import test_dataset

  result = model.evaluate(test_dataset(data.test, batch_size).map(lambda e: (e["x"], e["y"])),
                          verbose=0, return_dict=True)
  return {TEST_LOSS: result[LOSS], TEST_ACCURACY: result[ACCURACY_METRIC]}


@pytest.mark.parametrize("case", list(CASES))
def test_evaluator_equals_keras_evaluate_bit_for_bit(tmp_path, case, monkeypatch):
  config = load_config(tiny(tmp_path, **CASES[case]))
  data = process_lib.load_data(config)
  model = process_lib.make_keras_model(config, data)
  evaluator = evaluation.Evaluator(config, data, model)
  rng = np.random.default_rng(0)
  batches = 0
  for threads in (1, 3):
    monkeypatch.setattr(inprocess, "cpu_threads", lambda n=threads: n)
    state = [w + rng.normal(scale=0.3, size=w.shape).astype(w.dtype)
             for w in model.get_weights()]
    ours = evaluator(_Process(), state)
    batches = len(evaluator._splits()[TEST_LOSS, TEST_ACCURACY])  # noqa: SLF001
    model.set_weights(state)
    theirs = _keras_evaluate(model, data, config.data.eval_batch_size)
    assert ours == theirs, (case, threads)
    assert 0.0 < ours[TEST_ACCURACY] < 1.0 and np.isfinite(ours[TEST_LOSS])
  # One forward pass for every batch size, the partial last batch's included.
  forward = evaluator._forward()  # noqa: SLF001
  assert forward is evaluator._forward()  # noqa: SLF001
  assert forward.structured_input_signature[0][0].shape[0] is None
  n = sum(1 for _ in data.test)
  assert batches == -(-n // config.data.eval_batch_size) > 2
  assert n % config.data.eval_batch_size, "a partial last batch"


def test_contributions_are_added_in_batch_order_in_float32():
  """(total, count) pairs as a Keras `Reduce` metric adds them, then divided: a
  float32 sum is not associative, so the order is the result."""
  parts = [(np.float32(1e8), 1.0), (np.float32(3.0), 1.0), (np.float32(-1e8), 1.0)]
  ordered = evaluation._combine(parts)  # noqa: SLF001
  assert ordered == np.float32(np.float32(np.float32(1e8) + np.float32(3.0)) - np.float32(1e8)) / 3
  assert ordered != evaluation._combine([parts[0], parts[2], parts[1]])  # noqa: SLF001
  metric = tf.keras.metrics.Mean()
  for total, count in parts:
    metric.update_state(total / count, sample_weight=count)
  assert np.float32(metric.result().numpy()) == ordered
