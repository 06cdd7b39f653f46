"""Loss and metrics per task, as factories (TFF builds fresh objects per model_fn call).

Both tasks use ``SparseCategoricalCrossentropy(from_logits=True)``: the models return
logits, which is numerically safer than a softmax followed by a log. Accuracy is
reported under one name, ``ACCURACY_METRIC``, for every task; for ``next_char`` it
skips positions whose label is the padding id 0, which would otherwise count as easy
hits (the TFF Shakespeare baselines mask padding too). The loss is unmasked, as in LEAF.

The factories are classes and ``functools.partial`` objects, not lambdas, so they
pickle (Ray Tune ships trainables to worker processes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tensorflow as tf

TASKS = ("classification", "next_char")
ACCURACY_METRIC = "sparse_categorical_accuracy"
PAD_ID = 0


@tf.keras.utils.register_keras_serializable(package="tff_fedadamom")
class MaskedSparseCategoricalAccuracy(tf.keras.metrics.SparseCategoricalAccuracy):
  """Sparse categorical accuracy that ignores positions whose label is ``pad_id``."""

  def __init__(self, name: str = ACCURACY_METRIC, dtype=None, pad_id: int = PAD_ID):
    super().__init__(name=name, dtype=dtype)
    self.pad_id = pad_id

  def update_state(self, y_true, y_pred, sample_weight=None):
    mask = tf.cast(tf.not_equal(y_true, tf.cast(self.pad_id, y_true.dtype)), self.dtype)
    if sample_weight is not None:
      mask = mask * tf.cast(sample_weight, self.dtype)
    return super().update_state(y_true, y_pred, sample_weight=mask)

  def get_config(self):
    # TFF rebuilds metrics from their config when it finalizes them.
    return {**super().get_config(), "pad_id": self.pad_id}


def loss_and_metrics(task: str) -> tuple[Callable[[], tf.keras.losses.Loss],
                                         list[Callable[[], tf.keras.metrics.Metric]]]:
  """Returns ``(loss_factory, [metric_factory, ...])`` for ``task``."""
  loss = functools.partial(tf.keras.losses.SparseCategoricalCrossentropy, from_logits=True)
  if task == "classification":
    return loss, [functools.partial(tf.keras.metrics.SparseCategoricalAccuracy,
                                    name=ACCURACY_METRIC)]
  if task == "next_char":
    return loss, [MaskedSparseCategoricalAccuracy]
  raise ValueError(f"unknown task {task!r}; valid tasks: {list(TASKS)}")
