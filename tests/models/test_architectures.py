"""Exact parameter counts, output shapes and logits (no softmax) of every model."""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedadamom import models


@pytest.mark.parametrize("name, shape, classes, options, params, out_shape", [
    ("logistic", (28, 28), 10, {}, 7_850, (None, 10)),
    ("mlp", (28, 28, 1), 10, {}, 199_210, (None, 10)),  # McMahan et al.'s 2NN
    ("mlp", (60,), 10, dict(hidden=[16]), 60 * 16 + 16 + 16 * 10 + 10, (None, 10)),
    ("cnn", (28, 28, 1), 62, {}, 1_206_590, (None, 62)),  # Reddi et al. EMNIST-62
    ("cnn", (28, 28), 10, {}, 1_199_882, (None, 10)),  # (H, W) input gets a channel
    ("resnet18", (32, 32, 3), 10, {}, 11_173_962, (None, 10)),  # CIFAR-10
    ("resnet18", (32, 32, 3), 100, {}, 11_220_132, (None, 100)),  # CIFAR-100
    ("resnet18", (16, 16, 3), 10, dict(width=0.125), 176_402, (None, 10)),
    ("char_lstm", (80,), 90, {}, 820_522, (None, 80, 90)),  # LEAF Shakespeare
    ("char_lstm", (None,), 90, {}, 820_522, (None, None, 90)),
])
def test_param_count_and_output_shape(name, shape, classes, options, params, out_shape):
  model = models.build_model(name, input_shape=shape, num_classes=classes, **options)
  assert models.count_params(model) == params
  assert model.output_shape == out_shape
  assert not model.non_trainable_variables  # GroupNorm: nothing outside FedAvg's reach


def test_resnet18_imagenet_stem():
  # Same count as torchvision's resnet18 (11,689,512): GroupNorm has BatchNorm's
  # trainable parameters, and the 7x7 stem is chosen for inputs above 64 px.
  model = models.build_model("resnet18", input_shape=(224, 224, 3), num_classes=1000)
  assert models.count_params(model) == 11_689_512
  assert any(isinstance(l, tf.keras.layers.MaxPool2D) for l in model.layers)
  forced = models.build_model("resnet18", input_shape=(32, 32, 3), num_classes=10,
                              width=0.125, stem="imagenet")
  assert any(isinstance(l, tf.keras.layers.MaxPool2D) for l in forced.layers)


@pytest.mark.parametrize("name, x, classes, options", [
    ("logistic", np.random.RandomState(0).rand(4, 6).astype("float32"), 5, {}),
    ("mlp", np.random.RandomState(0).rand(4, 6).astype("float32"), 5, dict(hidden=(8,))),
    ("cnn", np.random.RandomState(0).rand(4, 8, 8, 1).astype("float32"), 5, {}),
    ("resnet18", np.random.RandomState(0).rand(4, 8, 8, 3).astype("float32"), 5,
     dict(width=0.125)),
    ("char_lstm", np.random.RandomState(0).randint(0, 5, (4, 6)).astype("int32"), 5,
     dict(embedding_dim=4, lstm_units=8)),
])
def test_outputs_are_logits(name, x, classes, options):
  model = models.build_model(name, input_shape=x.shape[1:], num_classes=classes,
                             seed=0, **options)
  assert model.layers[-1].activation is tf.keras.activations.linear
  out = model(x, training=False).numpy()
  assert out.shape == x.shape[:1] + ((x.shape[1],) if name == "char_lstm" else ()) + (classes,)
  assert np.all(np.isfinite(out))
  assert not np.allclose(out.sum(axis=-1), 1.0)
  assert (out < 0).any()


def test_with_keras_dropout_swaps_seeded_dropout_and_keeps_the_outputs():
  """The copy a run saves: Keras' Dropout in place of each SeededDropout (same
  rate and seed), the same outputs at inference; a model without one is returned
  as it is."""
  from tff_fedadamom.models._common import SeededDropout, with_keras_dropout

  model = models.build_model("cnn", input_shape=(8, 8, 1), num_classes=10, seed=5)
  seeded = [layer for layer in model.layers if isinstance(layer, SeededDropout)]
  assert len(seeded) == 2
  for variable in model.trainable_variables:  # not the seeded initial weights
    variable.assign(variable * 1.5 + 0.01)
  copy = with_keras_dropout(model)
  assert not any(isinstance(layer, SeededDropout) for layer in copy.layers)
  dropouts = [layer for layer in copy.layers if isinstance(layer, tf.keras.layers.Dropout)]
  assert [(d.rate, d.seed) for d in dropouts] == [(s.rate, s.seed) for s in seeded]
  x = np.random.default_rng(0).random((4, 8, 8, 1), np.float32)
  np.testing.assert_array_equal(copy(x, training=False).numpy(), model(x, training=False).numpy())
  plain = models.build_model("logistic", input_shape=(8, 8, 1), num_classes=10, seed=5)
  assert with_keras_dropout(plain) is plain
