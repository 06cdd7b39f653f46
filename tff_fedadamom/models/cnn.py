"""The EMNIST CNN of Reddi et al., "Adaptive Federated Optimization" (ICLR 2021).

Matches ``create_conv_dropout_model`` of the authors' TFF research code:
Conv(32, 3x3, valid, ReLU) -> Conv(64, 3x3, valid, ReLU) -> MaxPool(2) ->
Dropout(0.25) -> Flatten -> Dense(128, ReLU) -> Dropout(0.5) -> Dense(classes),
Glorot-normal kernels. The final softmax is left out: the loss takes logits.
On 28x28x1 inputs with 62 classes it has 1,206,590 parameters.

``seed`` fixes the initial weights and seeds the dropout layers
(`_common.SeededDropout`), as the research code does: unseeded dropout would
make two runs of one config differ, so neither a resume nor an exported best
config would reproduce a result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import tensorflow as tf

from tff_fedadamom.models import _common


def build_cnn(input_shape: Sequence[int], num_classes: int,
              seed: Optional[int] = None, *,
              conv_dropout: float = 0.25,
              dense_dropout: float = 0.5) -> tf.keras.Model:
  """Builds the CNN; ``conv_dropout``/``dense_dropout`` are the two dropout rates."""
  input_shape = _common.check_input_shape(input_shape, ranks=(2, 3))
  num_classes = _common.check_num_classes(num_classes)
  conv_dropout = _common.check_rate("conv_dropout", conv_dropout)
  dense_dropout = _common.check_rate("dense_dropout", dense_dropout)
  seeds = _common.SeedStream(seed)
  init = lambda: tf.keras.initializers.GlorotNormal(seeds())  # noqa: E731

  inputs, x = _common.image_input(input_shape)
  x = tf.keras.layers.Conv2D(32, 3, activation="relu", kernel_initializer=init())(x)
  x = tf.keras.layers.Conv2D(64, 3, activation="relu", kernel_initializer=init())(x)
  x = tf.keras.layers.MaxPool2D(2)(x)
  x = _common.seeded_dropout(conv_dropout, seeds())(x)
  x = tf.keras.layers.Flatten()(x)
  x = tf.keras.layers.Dense(128, activation="relu", kernel_initializer=init())(x)
  x = _common.seeded_dropout(dense_dropout, seeds())(x)
  logits = tf.keras.layers.Dense(num_classes, kernel_initializer=init())(x)
  return tf.keras.Model(inputs, logits, name="cnn")
