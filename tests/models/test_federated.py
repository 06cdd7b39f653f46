"""One TFF FedAvg round per model, on 2 clients x 8 examples with tiny widths.

This is the contract that matters: each model goes through
``tff.learning.models.from_keras_model`` with the factories of
``loss_and_metrics``, trains, and its weights move.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom import models

_CLIENTS, _EXAMPLES, _BATCH, _CLASSES = 2, 8, 4, 5

_CASES = {
    "logistic": ((4, 4), {}),
    "mlp": ((6,), dict(hidden=(8,))),
    "cnn": ((8, 8, 1), {}),
    "resnet18": ((16, 16, 3), dict(width=0.125)),
    "char_lstm": ((6,), dict(embedding_dim=4, lstm_units=8)),
}


def _client_data(name, shape):
  rng = np.random.RandomState(0)
  datasets = []
  for _ in range(_CLIENTS):
    if name == "char_lstm":
      chars = rng.randint(0, _CLASSES, (_EXAMPLES, shape[0] + 1)).astype("int32")
      x, y = chars[:, :-1], chars[:, 1:]
    else:
      x = rng.rand(_EXAMPLES, *shape).astype("float32")
      y = rng.randint(0, _CLASSES, (_EXAMPLES,)).astype("int32")
    datasets.append(tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=x, y=y)).batch(_BATCH))
  return datasets


def test_every_model_is_covered():
  assert sorted(_CASES) == models.list_models()


@pytest.mark.parametrize("name", sorted(_CASES))
def test_one_fedavg_round_trains(name):
  shape, options = _CASES[name]
  data = _client_data(name, shape)
  loss_fn, metric_fns = models.loss_and_metrics(models.MODELS[name].task)

  def model_fn():
    keras_model = models.build_model(name, input_shape=shape, num_classes=_CLASSES,
                                     seed=0, **options)
    return tff.learning.models.from_keras_model(
        keras_model, loss=loss_fn(), input_spec=data[0].element_spec,
        metrics=[m() for m in metric_fns])

  process = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
  state = process.initialize()
  before = process.get_model_weights(state).trainable
  output = process.next(state, data)
  after = process.get_model_weights(output.state).trainable

  train = output.metrics["client_work"]["train"]
  assert np.isfinite(train["loss"])
  assert 0.0 <= train[models.ACCURACY_METRIC] <= 1.0
  assert train["num_examples"] == _CLIENTS * _EXAMPLES
  assert any(not np.allclose(b, a) for b, a in zip(before, after))
