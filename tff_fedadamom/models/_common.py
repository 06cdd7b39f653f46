"""Helpers shared by the model builders: argument checks and per-layer seeds.

Builders never touch a global random seed (``tf.random.set_seed``): that would change
the randomness of everything else in the process (data shuffling, client sampling).
Instead every randomly initialized layer gets its own seed, derived from the model seed.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Optional

import numpy as np
import tensorflow as tf


class SeedStream:
  """One distinct initializer seed per call, derived from ``seed`` (None: always None).

  Keras initializers that share a seed give tensors of one shape identical
  values (two LSTM layers would start from the same recurrent kernel), so each
  call mixes the model seed with a counter through ``numpy.random.SeedSequence``.
  """

  def __init__(self, seed: Optional[int]):
    self._seed = seed
    self._count = 0

  def __call__(self) -> Optional[int]:
    if self._seed is None:
      return None
    self._count += 1
    word = np.random.SeedSequence([self._seed, self._count]).generate_state(1)[0]
    return int(word) % (2**31 - 1)


def is_int(value) -> bool:
  # bool is an int subclass; `True` as a width is a config mistake, not 1.
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_positive_int(name: str, value) -> int:
  if not is_int(value) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")
  return int(value)


def check_positive_ints(name: str, value) -> tuple[int, ...]:
  """A sequence (list from YAML, tuple in code) of positive integers, possibly empty."""
  if (isinstance(value, (str, bytes)) or not isinstance(value, Sequence)
      or not all(is_int(v) and v >= 1 for v in value)):
    raise ValueError(f"{name} must be a list of positive integers, got {value!r}")
  return tuple(int(v) for v in value)


def check_positive_float(name: str, value) -> float:
  if (not isinstance(value, numbers.Real) or isinstance(value, bool)
      or not np.isfinite(value) or value <= 0):
    raise ValueError(f"{name} must be a positive number, got {value!r}")
  return float(value)


def check_rate(name: str, value) -> float:
  """A dropout rate: 0 (off) up to, but excluding, 1 (which would drop everything)."""
  if (not isinstance(value, numbers.Real) or isinstance(value, bool)
      or not 0 <= value < 1):
    raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
  return float(value)


def check_input_shape(value, *, ranks: Sequence[int], allow_none: bool = False
                      ) -> tuple[Optional[int], ...]:
  """The per-example input shape (no batch dimension) with one of ``ranks``."""
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
    raise ValueError(f"input_shape must be a sequence of positive integers, got {value!r}")
  ok = all((v is None and allow_none) or (is_int(v) and v >= 1) for v in value)
  if not ok or len(value) not in ranks:
    kind = "positive integers or None" if allow_none else "positive integers"
    raise ValueError(f"input_shape must have rank {' or '.join(map(str, ranks))} "
                     f"and hold {kind}, got {value!r}")
  return tuple(None if v is None else int(v) for v in value)


def check_num_classes(value) -> int:
  if not is_int(value) or value < 2:
    raise ValueError(f"num_classes must be an integer >= 2, got {value!r}")
  return int(value)


def image_input(input_shape: tuple[int, ...]):
  """An image input; (H, W) grayscale data (EMNIST's ``pixels``) gets a channel axis."""
  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32, name="x")
  x = inputs
  if len(input_shape) == 2:
    x = tf.keras.layers.Reshape((*input_shape, 1))(x)
  return inputs, x


@tf.keras.utils.register_keras_serializable(package="tff_fedadamom")
class SeededDropout(tf.keras.layers.Layer):
  """Dropout with masks from a stateless random op, keyed by (seed, training step).

  Keras' seeded dropout keeps its place in the mask sequence in the op's kernel, so
  a client computation compiled once and called client after client would continue
  from whatever ran before it. Here the step is a non-trainable variable: every
  client starts from the server's 0, so its masks depend on `seed` and its step alone.
  """

  def __init__(self, rate: float, seed: int, **kwargs):
    super().__init__(**kwargs)
    self.rate = float(rate)
    self.seed = int(seed)

  def build(self, input_shape):
    self.step = self.add_weight(name="step", shape=(), dtype=tf.int64,
                                initializer="zeros", trainable=False)
    super().build(input_shape)

  def call(self, inputs, training=None):
    if training is None:
      training = tf.keras.backend.learning_phase()

    def dropped():
      step = self.step.assign_add(1)
      seed = tf.stack([tf.constant(self.seed, tf.int64), step])
      return tf.nn.experimental.stateless_dropout(inputs, rate=self.rate, seed=seed)

    return tf.__internal__.smart_cond.smart_cond(training, dropped,
                                                 lambda: tf.identity(inputs))

  def get_config(self):
    return {**super().get_config(), "rate": self.rate, "seed": self.seed}


def with_keras_dropout(model: tf.keras.Model) -> tf.keras.Model:
  """A copy of `model` (same weights) whose `SeededDropout` layers are Keras' own
  `Dropout`, or `model` itself when it has none.

  For the saved `model.keras`, which plain Keras must load without
  `tff_fedadamom.models`. Dropout is the identity at inference: same outputs.
  """
  if not any(isinstance(layer, SeededDropout) for layer in model.layers):
    return model

  def clone(layer):
    if isinstance(layer, SeededDropout):
      return tf.keras.layers.Dropout(layer.rate, seed=layer.seed, name=layer.name)
    return layer.__class__.from_config(layer.get_config())

  copy = tf.keras.models.clone_model(model, clone_function=clone)
  for layer, copied in zip(model.layers, copy.layers, strict=True):
    if not isinstance(layer, SeededDropout):
      copied.set_weights(layer.get_weights())
  return copy


def seeded_dropout(rate: float, seed: Optional[int]) -> tf.keras.layers.Layer:
  """`SeededDropout` for a seeded model, Keras' own dropout for an unseeded one."""
  if seed is None:
    return tf.keras.layers.Dropout(rate)
  return SeededDropout(rate, seed)
