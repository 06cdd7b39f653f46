"""ResNet-18 with GroupNorm in place of BatchNorm.

BatchNorm's running statistics are computed per client on small, non-IID
batches and then averaged, which hurts federated training; Hsieh et al. ("The
Non-IID Data Quagmire of Decentralized Machine Learning") and Reddi et al.
("Adaptive Federated Optimization", CIFAR experiments) use GroupNorm, which has
no running state. It has BatchNorm's trainable parameters (a scale and an offset
per channel), so counts match the familiar figures (11,173,962 for 32x32x3
inputs and 10 classes).

Small images (CIFAR, <= 64 px) get a 3x3 stride-1 stem convolution and no
max-pool; larger ones the ImageNet stem (7x7 stride-2 conv, 3x3 stride-2 max-pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import tensorflow as tf

from tff_fedadamom.models import _common

_STAGE_WIDTHS = (64, 128, 256, 512)
_BLOCKS_PER_STAGE = (2, 2, 2, 2)
_SMALL_INPUT_PX = 64
_EPSILON = 1e-5  # PyTorch's GroupNorm default, which the federated literature uses.


def build_resnet18(input_shape: Sequence[int], num_classes: int,
                   seed: Optional[int] = None, *,
                   groups: int = 2,
                   width: float = 1.0,
                   stem: str = "auto") -> tf.keras.Model:
  """Builds ResNet-18 (basic blocks [2, 2, 2, 2]) on (H, W, C) or (H, W) inputs.

  Args:
    groups: GroupNorm groups; must divide every stage width.
    width: Channel multiplier applied to 64/128/256/512 (small values for tests).
    stem: "auto" (by input size), "cifar" or "imagenet".
  """
  input_shape = _common.check_input_shape(input_shape, ranks=(2, 3))
  num_classes = _common.check_num_classes(num_classes)
  groups = _common.check_positive_int("groups", groups)
  width = _common.check_positive_float("width", width)
  if stem not in ("auto", "cifar", "imagenet"):
    raise ValueError(f"stem must be one of ['auto', 'cifar', 'imagenet'], got {stem!r}")
  widths = [max(1, round(w * width)) for w in _STAGE_WIDTHS]
  for w in widths:
    if w % groups:
      raise ValueError(f"groups must divide every stage width {widths} "
                       f"(width={width}), got groups={groups!r}")
  if stem == "auto":
    stem = "cifar" if max(input_shape[:2]) <= _SMALL_INPUT_PX else "imagenet"
  seeds = _common.SeedStream(seed)

  def conv(x, filters, kernel, stride):
    # No bias: the GroupNorm offset that follows plays that role.
    return tf.keras.layers.Conv2D(
        filters, kernel, strides=stride, padding="same", use_bias=False,
        kernel_initializer=tf.keras.initializers.HeNormal(seeds()))(x)

  def norm(x):
    return tf.keras.layers.GroupNormalization(groups=groups, epsilon=_EPSILON)(x)

  def block(x, filters, stride):
    shortcut = x
    y = tf.keras.layers.ReLU()(norm(conv(x, filters, 3, stride)))
    y = norm(conv(y, filters, 3, 1))
    if stride != 1 or x.shape[-1] != filters:
      shortcut = norm(conv(x, filters, 1, stride))
    return tf.keras.layers.ReLU()(tf.keras.layers.Add()([y, shortcut]))

  inputs, x = _common.image_input(input_shape)
  if stem == "cifar":
    x = tf.keras.layers.ReLU()(norm(conv(x, widths[0], 3, 1)))
  else:
    x = tf.keras.layers.ReLU()(norm(conv(x, widths[0], 7, 2)))
    x = tf.keras.layers.MaxPool2D(3, strides=2, padding="same")(x)
  for stage, (filters, blocks) in enumerate(zip(widths, _BLOCKS_PER_STAGE)):
    for i in range(blocks):
      x = block(x, filters, 2 if stage > 0 and i == 0 else 1)
  x = tf.keras.layers.GlobalAveragePooling2D()(x)
  logits = tf.keras.layers.Dense(
      num_classes, kernel_initializer=tf.keras.initializers.GlorotUniform(seeds()))(x)
  return tf.keras.Model(inputs, logits, name="resnet18")
