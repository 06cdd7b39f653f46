"""The LEAF Shakespeare next-character model (Caldas et al., "LEAF").

Embedding(vocab, 8) -> LSTM(256) -> LSTM(256) -> Dense(vocab) at every position,
as in LEAF and the Shakespeare task of Reddi et al. ("Adaptive Federated
Optimization"). Input: (seq_len,) int32 character ids, 0 being padding; output:
(seq_len, vocab) logits. ``num_classes`` is the vocabulary size, padding included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import tensorflow as tf

from tff_fedadamom.models import _common


def build_char_lstm(input_shape: Sequence[Optional[int]], num_classes: int,
                    seed: Optional[int] = None, *,
                    embedding_dim: int = 8,
                    lstm_units: int = 256) -> tf.keras.Model:
  """Builds the two-layer character LSTM; ``input_shape`` is ``(seq_len,)`` (None allowed)."""
  input_shape = _common.check_input_shape(input_shape, ranks=(1,), allow_none=True)
  vocab = _common.check_num_classes(num_classes)
  embedding_dim = _common.check_positive_int("embedding_dim", embedding_dim)
  lstm_units = _common.check_positive_int("lstm_units", lstm_units)
  seeds = _common.SeedStream(seed)

  inputs = tf.keras.Input(shape=input_shape, dtype=tf.int32, name="x")
  x = tf.keras.layers.Embedding(
      vocab, embedding_dim,
      embeddings_initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seeds()))(inputs)
  for _ in range(2):
    x = tf.keras.layers.LSTM(
        lstm_units, return_sequences=True,
        kernel_initializer=tf.keras.initializers.GlorotUniform(seeds()),
        recurrent_initializer=tf.keras.initializers.Orthogonal(seed=seeds()))(x)
  logits = tf.keras.layers.Dense(
      vocab, kernel_initializer=tf.keras.initializers.GlorotUniform(seeds()))(x)
  return tf.keras.Model(inputs, logits, name="char_lstm")
