"""Centralized evaluation of the global model on the test set (and the validation set).

The numbers are Keras' `model.evaluate`'s, bit for bit, but the batches run
side by side: each kernel runs on one thread (`tff_fedadamom.session`), so
`evaluate`, one batch after another, would use one core.

`evaluate` keeps its loss and each metric as a float32 running (total, count),
adding each batch's contribution in batch order. Here every batch computes its
contribution with Keras' own objects (the compiled loss container and a fresh
instance of each metric, updated once, as `evaluate`'s step does); the
contributions are then added in batch order in float32, and each result is
`total / count`: exact IEEE operations, so which thread ran a batch, and when,
changes nothing.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np

from tff_fedadamom.metric_names import (TEST_ACCURACY, TEST_LOSS, VALIDATION_ACCURACY,
                                        VALIDATION_LOSS)


def _combine(contributions) -> np.float32:
  """`total / count` of (total, count) float32 pairs added in order, as a Keras
  `Reduce` metric accumulates them."""
  total, count = np.float32(0.0), np.float32(0.0)
  for batch_total, batch_count in contributions:
    total = np.float32(total + np.float32(batch_total))
    count = np.float32(count + np.float32(batch_count))
  return np.float32(total / count) if count else np.float32(0.0)


class Evaluator:
  """Test (and validation) loss and accuracy of a learning process's global
  model, assigned to `keras_model`. The model is compiled and the splits batched
  when first needed, not before a run's first round.
  """

  def __init__(self, config, data, keras_model):
    self._config, self._data = config, data
    self.keras_model = keras_model  # parts sharing this evaluator save their models with it
    self._compiled = False
    self._batches = None
    self._predict = None

  def compiled_model(self):
    """The Keras model, compiled with the task's loss and metrics (`_compile`)."""
    if not self._compiled:
      self._compile(self.keras_model)
      self._compiled = True
    return self.keras_model

  def model_to_save(self):
    """The compiled model, with the weights last assigned to it, loadable with
    plain Keras (a seeded dropout saved as Keras' own: `with_keras_dropout`)."""
    from tff_fedadamom.models._common import with_keras_dropout

    model = self.compiled_model()
    portable = with_keras_dropout(model)
    if portable is not model:
      self._compile(portable)
    return portable

  def _compile(self, model) -> None:
    """Compiles `model` with the task's loss and metrics and a built plain SGD."""
    from tff_fedadamom import models

    loss_factory, self._metric_factories = models.loss_and_metrics(
        models.MODELS[self._config.model.name].task)
    # model.keras is saved with an optimizer, for a user to go on training: plain
    # SGD, built, so that a load does not warn it skipped the variables it expected.
    model.compile(optimizer="sgd", loss=loss_factory(),
                  metrics=[m() for m in self._metric_factories])
    model.optimizer.build(model.trainable_variables)

  def _forward(self):
    """The forward pass of `evaluate`'s step, traced once for any batch size,
    before the batches run side by side (concurrent first calls would each
    trace it)."""
    import tensorflow as tf

    if self._predict is None:
      model = self.compiled_model()
      x = next(iter(self._splits().values()))[0][0]  # the test set's first batch
      spec = tf.TensorSpec([None, *x.shape[1:]], x.dtype)
      self._predict = tf.function(lambda x: model(x, training=False),
                                  input_signature=[spec]).get_concrete_function()
    return self._predict

  def _splits(self) -> dict:
    """{(loss name, accuracy name): the split's batches as (x, y) tensors}, for
    the test set and the validation set when there is one; made once."""
    from tff_fedadamom.data import test_dataset

    if self._batches is None:
      splits = {(TEST_LOSS, TEST_ACCURACY): self._data.test,
                (VALIDATION_LOSS, VALIDATION_ACCURACY): self._data.validation}
      size = self._config.data.eval_batch_size
      self._batches = {names: [(b["x"], b["y"]) for b in test_dataset(split, size)]
                       for names, split in splits.items() if split is not None}
    return self._batches

  def _contributions(self, predict, x, y) -> list:
    """One batch's (total, count) for the loss, then for each metric: what
    `evaluate`'s step adds to each running mean for this batch."""
    import tensorflow as tf

    y_pred = predict(x)
    model = self.keras_model
    # Keras' loss tracker: the batch's mean loss, weighted by its size. (The
    # container also updates the model's own tracker, which nothing here reads.)
    loss = tf.keras.metrics.Mean()
    batch_loss = model.compiled_loss(y, y_pred, regularization_losses=model.losses)
    loss.update_state(batch_loss, sample_weight=tf.shape(y)[0])
    out = [loss]
    for factory in self._metric_factories:
      metric = factory()
      metric.update_state(y, y_pred)
      out.append(metric)
    return [(m.total.numpy(), m.count.numpy()) for m in out]

  def __call__(self, process, state) -> dict[str, float]:
    from tff_fedadamom.runtime import inprocess

    model = self.compiled_model()
    process.get_model_weights(state).assign_weights_to(model)
    predict = self._forward()
    out = {}
    for names, batches in self._splits().items():
      # As many batches at once as clients run (each batch's kernels on one thread).
      with concurrent.futures.ThreadPoolExecutor(
          max(1, min(inprocess.cpu_threads(), len(batches))),
          thread_name_prefix="tff-eval") as pool:
        per_batch = list(pool.map(lambda b: self._contributions(predict, *b), batches))
      out.update(zip(names, (float(_combine(parts)) for parts in list(zip(*per_batch))[:2])))
    return out
