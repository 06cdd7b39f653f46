"""FedAvg's client work over a client's stacked batches: no loop over a dataset.

TFF's client work (`build_model_delta_client_work`) reads a client's batches
from a `tf.data` iterator inside a loop; on a small model that loop, not the
training, is most of a client's time (`benchmarks/rounds.py`). Here a client's
data is a TFF sequence (the only client data TFF 0.87's `ClientWorkProcess`
accepts) of one element, its round batches stacked (`ClientTensors.stacked`: F
full batches and a last one of r >= 0 examples); each step gathers its batch
(`client_tensors.batch_of`), so a client holds no more memory than TFF's loop.

The update is TFF 0.87's `build_model_delta_update_with_tff_optimizer`, except
that the loop is a `tf.while_loop` over the F full batches, then one step on the
last when r > 0: the same ops on the same batches in the same order, so the
results are bit-identical to TFF's. A `tf.while_loop` rather than the steps
written out, each guarded by `tf.cond(i < F)`: TensorFlow's executor still
visits every op of a branch not taken, and the loop's graph does not grow with
the number of batches.
"""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning import tensor_utils

from tff_fedadamom.algorithms._common import num_examples_of, state_as_hparams
from tff_fedadamom.data.client_tensors import EXAMPLES, FULL, LAST, batch_of


def is_stacked(sequence_type) -> bool:
  """Whether a TFF `SequenceType` is one of stacked client batches."""
  element = getattr(sequence_type, "element", None)
  return isinstance(element, tff.StructType) and [
      name for name, _ in tff.structure.iter_elements(element)] == [EXAMPLES, FULL, LAST]


def build_unrolled_update(model_fn: Callable[[], tff.learning.models.VariableModel],
                          weighting: tff.learning.ClientWeighting):
  """`(optimizer, initial_weights, element, hparams) -> (ClientResult, metrics)`
  over one stacked element (module docstring)."""
  model = model_fn()

  @tf.function
  def client_update(optimizer, initial_weights, element, hparams):
    weights = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, initial_weights)
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in tf.nest.flatten(weights.trainable))
    state = (tf.zeros([], tf.int64),
             optimizer.set_hparams(optimizer.initialize(specs), hparams))

    def step(state, batch):
      examples, optimizer_state = state
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      gradients = tape.gradient(output.loss, weights.trainable)
      optimizer_state, trained = optimizer.next(
          optimizer_state, tuple(tf.nest.flatten(weights.trainable)),
          tuple(tf.nest.flatten(gradients)))
      tf.nest.map_structure(lambda v, t: v.assign(t), weights.trainable,
                            tf.nest.pack_sequence_as(weights.trainable, trained))
      return examples + num_examples_of(output), optimizer_state

    full, last = element[FULL], element[LAST]
    count = tf.shape(full)[0]  # once, not in the loop's condition at every step
    _, state = tf.while_loop(
        lambda i, _: i < count,
        lambda i, state: (i + 1, step(state, batch_of(element, full[i]))),
        (tf.constant(0), state))
    state = tf.cond(tf.shape(last)[0] > 0,
                    lambda: step(state, batch_of(element, last)), lambda: state)
    delta = tf.nest.map_structure(tf.subtract, initial_weights.trainable, weights.trainable)
    delta, non_finite = tensor_utils.zero_all_if_any_non_finite(delta)
    if non_finite > 0:  # as TFF: the client's metrics are dropped with its update
      weight = tf.constant(0.0, tf.float32)
      model.reset_metrics()
    elif weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
      weight = tf.cast(state[0], tf.float32)
    else:
      weight = tf.constant(1.0, tf.float32)
    return (tff.learning.templates.ClientResult(update=delta, update_weight=weight),
            model.report_local_unfinalized_metrics())

  return client_update


def build_unrolled_client_work(model_fn, optimizer, weighting, *, batch_size: int,
                               metrics_aggregator=None):
  """`tff.learning.templates.build_model_delta_client_work(model_fn, optimizer,
  weighting, metrics_aggregator)`, composed as TFF 0.87 composes it (the
  client optimizer's hparams as its state), over stacked batches of `batch_size`."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, found {batch_size}")
  metrics_aggregator = metrics_aggregator or tff.learning.metrics.sum_then_finalize
  with tf.Graph().as_default():
    model = model_fn()
    aggregate_metrics = metrics_aggregator(model.metric_finalizers())
  # A client's examples have the spec of a batch.
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(collections.OrderedDict([
      (EXAMPLES, model.input_spec), (FULL, tf.TensorSpec([None, batch_size], tf.int64)),
      (LAST, tf.TensorSpec([None], tf.int64))])))
  weights_type = tff.learning.models.weights_type_from_model(model)
  hparams = optimizer.get_hparams(optimizer.initialize(tf.TensorSpec((), tf.float32)))

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(hparams, tff.SERVER)

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type, weights_type, data_type)
  def client_update(state, weights, dataset):
    update = build_unrolled_update(model_fn, weighting)
    return update(optimizer, weights, dataset.get_single_element(), state)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(weights_type, tff.CLIENTS),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    result, outputs = tff.federated_map(
        client_update, (tff.federated_broadcast(state), weights, client_data))
    measurements = tff.federated_zip(collections.OrderedDict(train=aggregate_metrics(outputs)))
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn,
                                                  **state_as_hparams(state_type))
