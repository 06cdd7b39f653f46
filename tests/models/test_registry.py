"""Registry, argument checking, seeding and the loss/metric factories."""

import pickle

import numpy as np
import pytest
import tensorflow as tf

from tff_fedadamom import models


def _weights(model):
  return [v.numpy() for v in model.variables]


def test_registry_contents():
  assert models.list_models() == ["char_lstm", "cnn", "logistic", "mlp", "resnet18"]
  for name, spec in models.MODELS.items():
    assert isinstance(spec, models.ModelSpec)
    assert spec.name == name and spec.description
    assert spec.task in ("classification", "next_char")
  assert models.MODELS["char_lstm"].task == "next_char"
  assert dict(models.MODELS["mlp"].options) == {"hidden": (200, 200)}
  assert dict(models.MODELS["cnn"].options) == {"conv_dropout": 0.25, "dense_dropout": 0.5}
  assert dict(models.MODELS["resnet18"].options) == {"groups": 2, "width": 1.0, "stem": "auto"}
  assert dict(models.MODELS["char_lstm"].options) == {"embedding_dim": 8, "lstm_units": 256}
  assert dict(models.MODELS["logistic"].options) == {}
  with pytest.raises(TypeError):
    models.MODELS["mlp"].options["hidden"] = (1,)  # read-only


def test_unknown_model_lists_valid_names():
  with pytest.raises(ValueError, match=r"unknown model 'vgg'.*'char_lstm'.*'resnet18'"):
    models.build_model("vgg", input_shape=(4,), num_classes=2)


def test_unknown_option_names_it_and_lists_valid_ones():
  with pytest.raises(ValueError, match=r"\['depth'\].*'mlp'.*valid options: \['hidden'\]"):
    models.build_model("mlp", input_shape=(4,), num_classes=2, depth=3)


@pytest.mark.parametrize("name, option, value", [
    ("mlp", "hidden", (4, -1)),
    ("mlp", "hidden", "200"),
    ("cnn", "conv_dropout", 1.0),
    ("cnn", "dense_dropout", -0.1),
    ("resnet18", "width", -0.5),
    ("resnet18", "groups", 0),
    ("resnet18", "groups", 3),  # does not divide 64
    ("resnet18", "stem", "vit"),
    ("char_lstm", "lstm_units", 0),
    ("char_lstm", "embedding_dim", True),
])
def test_bad_option_value_names_option_and_value(name, option, value):
  shape = (5,) if name == "char_lstm" else (8, 8, 1)
  with pytest.raises(ValueError, match=rf"{option}.*{value!r}".replace("(", r"\(").replace(")", r"\)")):
    models.build_model(name, input_shape=shape, num_classes=3, **{option: value})


@pytest.mark.parametrize("kwargs, match", [
    (dict(input_shape=(0, 4)), "input_shape"),
    (dict(input_shape="28"), "input_shape"),
    (dict(num_classes=1), "num_classes"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
])
def test_bad_common_arguments(kwargs, match):
  args = dict(input_shape=(4,), num_classes=3)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    models.build_model("logistic", **args)


def test_wrong_input_rank():
  with pytest.raises(ValueError, match="input_shape"):
    models.build_model("cnn", input_shape=(784,), num_classes=10)
  with pytest.raises(ValueError, match="input_shape"):
    models.build_model("char_lstm", input_shape=(5, 2), num_classes=10)


@pytest.mark.parametrize("name, shape, options", [
    ("mlp", (6,), dict(hidden=(5, 5))),
    ("cnn", (8, 8, 1), {}),
    ("resnet18", (8, 8, 3), dict(width=0.125)),
    ("char_lstm", (5,), dict(embedding_dim=4, lstm_units=8)),
])
def test_seed_makes_initialization_deterministic(name, shape, options):
  build = lambda seed: models.build_model(  # noqa: E731
      name, input_shape=shape, num_classes=4, seed=seed, **options)
  first, again, other = _weights(build(3)), _weights(build(3)), _weights(build(4))
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b) for a, b in zip(first, other) if a.size > 1)


def test_layers_get_distinct_seeds():
  # Same-shaped kernels must not start identical just because they share a model seed.
  model = models.build_model("mlp", input_shape=(5,), num_classes=5, seed=0, hidden=(5, 5))
  kernels = [v.numpy() for v in model.trainable_variables if v.shape == (5, 5)]
  assert len(kernels) == 3
  assert not np.array_equal(kernels[0], kernels[1])
  assert not np.array_equal(kernels[1], kernels[2])


def test_count_params_counts_trainable_only():
  model = models.build_model("logistic", input_shape=(3,), num_classes=2)
  model.add_weight(name="counter", shape=(7,), trainable=False)
  assert models.count_params(model) == 3 * 2 + 2


def test_loss_and_metrics_classification():
  loss_fn, metric_fns = models.loss_and_metrics("classification")
  loss = loss_fn()
  assert isinstance(loss, tf.keras.losses.SparseCategoricalCrossentropy)
  assert loss.get_config()["from_logits"] is True
  metric = metric_fns[0]()
  assert isinstance(metric, tf.keras.metrics.SparseCategoricalAccuracy)
  assert metric.name == models.ACCURACY_METRIC
  assert loss_fn() is not loss  # fresh objects per call (TFF model_fn needs that)
  pickle.dumps((loss_fn, metric_fns))


def test_next_char_accuracy_ignores_padding():
  loss_fn, metric_fns = models.loss_and_metrics("next_char")
  assert loss_fn().get_config()["from_logits"] is True
  metric = metric_fns[0]()
  assert metric.name == models.ACCURACY_METRIC
  y_true = tf.constant([[1, 2, 0, 0]])
  # Predicts 1 everywhere: right at position 0, wrong at 1, "right" nowhere on padding.
  y_pred = tf.one_hot([[1, 1, 1, 1]], depth=3)
  metric.update_state(y_true, y_pred)
  assert metric.result().numpy() == pytest.approx(0.5)
  clone = type(metric).from_config(metric.get_config())  # what TFF's finalizer does
  assert clone.pad_id == 0 and clone.name == metric.name
  pickle.dumps((loss_fn, metric_fns))


def test_unknown_task():
  with pytest.raises(ValueError, match="next_char"):
    models.loss_and_metrics("regression")
