"""Fully connected baselines: multinomial logistic regression and an MLP.

The MLP default (two hidden layers of 200 ReLU units) is the "2NN" of McMahan et
al., "Communication-Efficient Learning of Deep Networks from Decentralized Data".
Both flatten whatever input they get, so they work on images and feature vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import tensorflow as tf

from tff_fedadamom.models import _common


def build_logistic(input_shape: Sequence[int], num_classes: int,
                   seed: Optional[int] = None) -> tf.keras.Model:
  """Flatten + Dense(num_classes): a convex baseline, where optimizer theory applies."""
  return build_mlp(input_shape, num_classes, seed, hidden=())


def build_mlp(input_shape: Sequence[int], num_classes: int,
              seed: Optional[int] = None, *,
              hidden: Sequence[int] = (200, 200)) -> tf.keras.Model:
  """Flatten + Dense(h, ReLU) for each h in ``hidden`` + Dense(num_classes) logits."""
  input_shape = _common.check_input_shape(input_shape, ranks=range(1, 5))
  num_classes = _common.check_num_classes(num_classes)
  hidden = _common.check_positive_ints("hidden", hidden)
  seeds = _common.SeedStream(seed)

  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32, name="x")
  x = tf.keras.layers.Flatten()(inputs)
  for units in hidden:
    x = tf.keras.layers.Dense(
        units, activation="relu",
        kernel_initializer=tf.keras.initializers.GlorotUniform(seeds()))(x)
  logits = tf.keras.layers.Dense(
      num_classes, kernel_initializer=tf.keras.initializers.GlorotUniform(seeds()))(x)
  return tf.keras.Model(inputs, logits, name="logistic" if not hidden else "mlp")
