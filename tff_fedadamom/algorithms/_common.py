"""The TFF composition shared by the client-adaptive processes (FedCAda, FAFED).

A client starts a round from the global model AND global optimizer statistics,
and sends back its trained model and statistics, which the server averages. In
`tff.learning.templates.compose_learning_process` the one value broadcast is
the "global model weights"; here it is a global state

    OrderedDict(model=ModelWeights, accumulator=[...], preconditioner=[...], ...)

(TFF's Adam slot names, which telemetry reads), broadcast as it is. The client
work sends `OrderedDict(model=initial - trained, <statistics>)`, a weighted
`MeanFactory` averages it, and the finalizer applies `model <- model - eta *
mean pseudo-gradient` and keeps the mean statistics. `build` re-wraps the
composed process so that `get_model_weights` returns the model alone.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Mapping, Optional

import tensorflow as tf
import tensorflow_federated as tff
# The training loop over a client's dataset that TFF's own client works use.
from tensorflow_federated.python.learning import loop_builder

from tff_fedadamom.optimizers.client import check_clip_and_decay, clip_and_decay
# The state vocabulary's one home (the algorithms use these names as `_common.*`).
from tff_fedadamom.optimizers.state import ACCUMULATOR_KEY, LEARNING_RATE_KEY  # noqa: F401
from tff_fedadamom.optimizers.state import MODEL_KEY, PRECONDITIONER_KEY  # noqa: F401

ROUND_KEY = 'round_num'  # The round number in the client work's server state.


def check_positive(name: str, value, *, algorithm: str) -> None:
  if not value > 0:
    raise ValueError(f'{algorithm} `{name}` must be > 0, found {value}.')


def check_unit(name: str, value, *, algorithm: str) -> None:
  if not 0 <= value < 1:
    raise ValueError(f'{algorithm} `{name}` must be in [0, 1), found {value}.')


def _all_finite(structure) -> tf.Tensor:
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tf.nest.flatten(structure)])


def state_as_hparams(state_type) -> dict:
  """`get_hparams_fn` and `set_hparams_fn` of a process whose whole state is its hparams."""
  return dict(
      get_hparams_fn=tff.tensorflow.computation(lambda state: state, state_type),
      set_hparams_fn=tff.tensorflow.computation(lambda state, hparams: hparams, state_type,
                                                state_type))


def num_examples_of(output) -> tf.Tensor:
  if output.num_examples is None:
    return tf.shape(output.predictions, out_type=tf.int64)[0]
  return tf.cast(output.num_examples, tf.int64)


def client_result(model, weighting, initial_trainable, trained_trainable,
                  statistics: Mapping[str, Any], num_examples):
  """The client's update `OrderedDict(model=initial - trained, **statistics)`.

  As TFF's `model_delta_client_work`: a non-finite update is zeroed and sent with
  weight 0 (and the client's metrics are reset), so one diverged client does not
  poison the average.
  """
  update = collections.OrderedDict(
      [(MODEL_KEY, tf.nest.map_structure(tf.subtract, initial_trainable, trained_trainable))]
      + list(statistics.items()))
  finite = _all_finite(update)
  update = tf.nest.map_structure(
      lambda t: tf.where(finite, t, tf.zeros_like(t)), update)
  if weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
    weight = tf.cast(num_examples, tf.float32)
  elif weighting == tff.learning.ClientWeighting.UNIFORM:
    weight = tf.constant(1.0, tf.float32)
  else:
    raise ValueError(f'`client_weighting` must be UNIFORM or NUM_EXAMPLES, found {weighting}.')
  weight = tf.where(finite, weight, 0.0)

  def reset():
    model.reset_metrics()
    return tf.constant(0)

  with tf.control_dependencies([tf.cond(finite, lambda: tf.constant(0), reset)]):
    metrics = model.report_local_unfinalized_metrics()
  return (tff.learning.templates.ClientResult(update=update, update_weight=weight), metrics)


def zero_moments(trainable) -> collections.OrderedDict:
  """Initial statistics: zero `accumulator` and `preconditioner` shaped like `trainable`."""
  return collections.OrderedDict([(ACCUMULATOR_KEY, [tf.zeros_like(w) for w in trainable]),
                                  (PRECONDITIONER_KEY, [tf.zeros_like(w) for w in trainable])])


def initial_global_state_fn(model_fn, initial_statistics: Callable[[list], Mapping]):
  """A no-arg `tff.tensorflow.computation`: the model's initial weights and zero statistics."""

  @tff.tensorflow.computation()
  def init():
    model = model_fn()
    weights = tff.learning.models.ModelWeights.from_model(model)
    trainable = [tf.convert_to_tensor(v) for v in weights.trainable]
    return collections.OrderedDict(
        [(MODEL_KEY, tff.learning.models.ModelWeights(
            trainable, [tf.convert_to_tensor(v) for v in weights.non_trainable]))]
        + list(initial_statistics(trainable).items()))

  return init


def build_client_work(model_fn, make_client_update, hparams: Mapping[str, float],
                      global_type) -> tff.learning.templates.ClientWorkProcess:
  """A `ClientWorkProcess` running `make_client_update()` (called inside the
  client computation: `(state, global_state, dataset) -> (ClientResult,
  unfinalized metrics)`) on every client.

  Its server state is `OrderedDict(**hparams, round_num)`: the float32 hparams
  are what `get_hparams`/`set_hparams` expose, `round_num` counts the rounds.
  """
  with tf.Graph().as_default():
    model = model_fn()
    metrics_aggregation_fn = tff.learning.metrics.sum_then_finalize(model.metric_finalizers())
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(model.input_spec))

  @tff.tensorflow.computation()
  def initial_state_fn():
    return collections.OrderedDict(
        [(k, tf.constant(v, tf.float32)) for k, v in hparams.items()]
        + [(ROUND_KEY, tf.constant(0, tf.int32))])

  @tff.federated_computation()
  def init_fn():
    return tff.federated_eval(initial_state_fn, tff.SERVER)

  state_type = init_fn.type_signature.result.member
  hparams_type = tff.types.tensorflow_to_type(collections.OrderedDict(
      (k, tf.TensorSpec([], tf.float32)) for k in hparams))

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return collections.OrderedDict((k, state[k]) for k in hparams)

  @tff.tensorflow.computation(state_type, hparams_type)
  def set_hparams_fn(state, new_hparams):
    return collections.OrderedDict(
        [(k, new_hparams[k]) for k in hparams] + [(ROUND_KEY, state[ROUND_KEY])])

  @tff.tensorflow.computation(state_type, global_type, data_type)
  def client_update(state, global_state, dataset):
    return make_client_update()(state, global_state, dataset)

  @tff.tensorflow.computation(state_type)
  def advance(state):
    return collections.OrderedDict(
        [(k, state[k]) for k in hparams] + [(ROUND_KEY, state[ROUND_KEY] + 1)])

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(global_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, global_state, client_data):
    state_at_clients = tff.federated_broadcast(state)
    result, model_outputs = tff.federated_map(
        client_update, (state_at_clients, global_state, client_data))
    measurements = tff.federated_zip(
        collections.OrderedDict(train=metrics_aggregation_fn(model_outputs)))
    return tff.templates.MeasuredProcessOutput(
        tff.federated_map(advance, state), result, measurements)

  return tff.learning.templates.ClientWorkProcess(
      init_fn, next_fn, get_hparams_fn=get_hparams_fn, set_hparams_fn=set_hparams_fn)


def build_finalizer(global_type, update_type,
                    server_learning_rate: float) -> tff.learning.templates.FinalizerProcess:
  """Applies the mean pseudo-gradient with the server learning rate; takes the mean statistics.

  State `OrderedDict(learning_rate=eta)`, which is also its hparams. A non-finite
  result is rejected and counted in `update_non_finite`, as TFF's
  `apply_optimizer_finalizer` does.
  """

  @tff.tensorflow.computation()
  def initial_state_fn():
    return collections.OrderedDict(
        [(LEARNING_RATE_KEY, tf.constant(server_learning_rate, tf.float32))])

  @tff.federated_computation()
  def init_fn():
    return tff.federated_eval(initial_state_fn, tff.SERVER)

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type, global_type, update_type)
  def apply(state, global_state, update):
    model = global_state[MODEL_KEY]
    lr = state[LEARNING_RATE_KEY]
    trainable = tf.nest.map_structure(lambda w, g: w - tf.cast(lr, g.dtype) * g,
                                      model.trainable, update[MODEL_KEY])
    candidate = collections.OrderedDict(
        [(MODEL_KEY, tff.learning.models.ModelWeights(trainable, model.non_trainable))]
        + [(k, update[k]) for k in global_state if k != MODEL_KEY])
    finite = _all_finite(candidate)
    new_state = tf.nest.map_structure(lambda new, old: tf.where(finite, new, old),
                                      candidate, global_state)
    return new_state, tf.cast(tf.logical_not(finite), tf.int32)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(global_type, tff.SERVER),
      tff.FederatedType(update_type, tff.SERVER))
  def next_fn(state, global_state, update):
    new_global, non_finite = tff.federated_map(apply, (state, global_state, update))
    measurements = tff.federated_zip(collections.OrderedDict(update_non_finite=non_finite))
    return tff.templates.MeasuredProcessOutput(state, new_global, measurements)

  return tff.learning.templates.FinalizerProcess(init_fn, next_fn,
                                                 **state_as_hparams(state_type))


def client_update_builder(model_fn, local_rule, weighting, weight_decay, clip_norm,
                          loop_implementation):
  """`make_client_update` for `build_client_work` from an algorithm's local rule.

  `local_rule(model, trainable, state, global_state, dataset, reduce_fn, transform)`
  trains the model's `trainable` variables (already holding the global model) and
  returns `(statistics, num_examples)`; `transform(trainable, gradients)` is the
  clients' clip-and-decay. This wrapper loads the global model and packs the result.
  """
  def transform(trainable, gradients):
    return clip_and_decay(trainable, gradients, weight_decay, clip_norm)

  def make():
    model = model_fn()
    reduce_fn = loop_builder.build_training_loop(loop_implementation)

    @tf.function
    def client_update(state, global_state, dataset):
      weights = tff.learning.models.ModelWeights.from_model(model)
      tf.nest.map_structure(lambda v, t: v.assign(t), weights, global_state[MODEL_KEY])
      initial = [tf.identity(v) for v in weights.trainable]
      statistics, num_examples = local_rule(model, weights.trainable, state, global_state,
                                            dataset, reduce_fn, transform)
      return client_result(model, weighting, initial, weights.trainable, statistics,
                           num_examples)

    return client_update

  return make


def build(algorithm: str, model_fn, client_learning_rate: float, *, learning_rate: float,
          client_hparams: Mapping[str, float], initial_statistics, local_rule,
          client_weighting=tff.learning.ClientWeighting.UNIFORM,
          client_lr_decay: float = 1.0, weight_decay: float = 0.0,
          clip_norm: Optional[float] = None, model_aggregator=None,
          loop_implementation: tff.learning.LoopImplementation = (
              tff.learning.LoopImplementation.DATASET_REDUCE)
          ) -> tff.learning.templates.LearningProcess:
  """The process of client-adaptive `algorithm` (its name in errors).

  The clients' step size is `client_learning_rate`, times `client_lr_decay` per
  round; `learning_rate` (eta) is the server's step on the mean model update (1 =
  averaging); `client_hparams` are the algorithm's own (in the client work's
  state); `initial_statistics(trainable tensors) -> OrderedDict` gives the
  statistics' initial values, names and types, and `local_rule` trains a client
  (`client_update_builder`). `client_weighting` weights the update and statistics alike;
  `model_aggregator` is a weighted aggregation factory (default `MeanFactory()`);
  TFF's `DATASET_ITERATOR` `loop_implementation` lets training ops leave the CPU.
  """
  check_positive('client_learning_rate', client_learning_rate, algorithm=algorithm)
  check_clip_and_decay(algorithm, weight_decay, clip_norm)
  if not 0 < client_lr_decay <= 1:
    raise ValueError(
        f'{algorithm} `client_lr_decay` must be in (0, 1], found {client_lr_decay}.')
  hparams = collections.OrderedDict(
      [(LEARNING_RATE_KEY, client_learning_rate), ('lr_decay', client_lr_decay)]
      + list(client_hparams.items()))
  make_client_update = client_update_builder(model_fn, local_rule, client_weighting,
                                             weight_decay, clip_norm, loop_implementation)

  initial_global = initial_global_state_fn(model_fn, initial_statistics)
  global_type = initial_global.type_signature.result
  distributor = tff.learning.templates.build_broadcast_process(global_type)
  client_work = build_client_work(model_fn, make_client_update, hparams, global_type)
  result_type = client_work.next.type_signature.result.result.member
  factory = model_aggregator if model_aggregator is not None else tff.aggregators.MeanFactory()
  aggregator = factory.create(result_type.update, result_type.update_weight)
  finalizer = build_finalizer(global_type, aggregator.next.type_signature.result.result.member,
                              learning_rate)
  composed = tff.learning.templates.compose_learning_process(
      initial_global, distributor, client_work, aggregator, finalizer)

  state_type = composed.next.type_signature.parameter[0].member
  weights_type = state_type.global_model_weights[MODEL_KEY]

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights[MODEL_KEY]

  @tff.tensorflow.computation(state_type, weights_type)
  def set_model_weights(state, weights):
    global_state = collections.OrderedDict(state.global_model_weights)
    global_state[MODEL_KEY] = weights
    return state._replace(global_model_weights=global_state)

  return tff.learning.templates.LearningProcess(
      composed.initialize, composed.next, get_model_weights, set_model_weights,
      get_hparams_fn=composed.get_hparams, set_hparams_fn=composed.set_hparams)
