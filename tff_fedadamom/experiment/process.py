"""Config -> `tff.learning.templates.LearningProcess`: `build_process` is the one
place where a config becomes TFF objects (the Keras model, the server optimizer
in its learning-rate schedule, the client optimizer and weighting, or a whole
learning process from the registry).
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedadamom import methods, models
from tff_fedadamom.algorithms.unrolled import build_unrolled_client_work
from tff_fedadamom.config import ExperimentConfig, config_to_dict, schema
from tff_fedadamom.data import FederatedData, load_federated_data
from tff_fedadamom.lru import lru_get, lru_put
from tff_fedadamom.optimizers.client import build_client_sgd


def load_data(config: ExperimentConfig) -> FederatedData:
  """Loads the config's federated data set through the data registry."""
  from tff_fedadamom.data import DATASETS

  data = config.data
  kind, partition = schema.split_kind(data.partition, schema.DEFAULT_PARTITION_KIND)
  kwargs = dict(path=data.path, seed=data.seed, **data.options)
  if DATASETS[data.name].natural_clients:
    if data.num_clients is not None:
      kwargs["num_clients"] = data.num_clients
  else:
    kwargs.update(num_clients=data.num_clients, partition=kind,
                  partition_options=partition)
  loaded = load_federated_data(data.name, **kwargs)
  if config.validation is None:
    return loaded
  from tff_fedadamom.data.validation import hold_out_validation

  return hold_out_validation(loaded, config.validation.fraction, data.seed)


def client_tensors_options(config: ExperimentConfig) -> dict:
  """What a run's `ClientTensors` is made with besides its training data."""
  client = config.client
  return dict(seed=config.seed, batch_size=client.batch_size,
              local_epochs=client.local_epochs, augment=config.data.augment,
              max_examples=client.max_examples)


def make_client_tensors(config: ExperimentConfig, data: FederatedData):
  """The training clients as tensors, with the config's batching (`ClientTensors`)."""
  from tff_fedadamom.data.client_tensors import ClientTensors

  return ClientTensors(data.train, **client_tensors_options(config))


def client_datasets(config: ExperimentConfig, data: FederatedData, client_ids,
                    round_num: int) -> list[tf.data.Dataset]:
  """The batched datasets of `client_ids` for round `round_num`, shuffled as a
  function of (seed, round, client): a resumed run feeds the same batches."""
  return make_client_tensors(config, data).datasets(client_ids, round_num)


def input_spec(config: ExperimentConfig, data: FederatedData):
  """The batched element spec TFF's model wrapper needs."""
  return client_datasets(config, data, [data.train.client_ids[0]], 0)[0].element_spec


def data_signature(config: ExperimentConfig, data: FederatedData, spec=None,
                   unroll_steps: Optional[int] = None) -> dict:
  """All a learning process built by `build_process` sees of `data`: TFF's input
  spec (`spec`, if the caller has it), the model's input shape and class count,
  and with `unroll_steps` the batch size of the stacked batches (their number
  does not enter the computation: it loops over them). Examples reach the
  process as its clients' datasets."""
  spec = spec if spec is not None else input_spec(config, data)
  signature = {"input_spec": repr(spec), "input_shape": list(data.input_shape),
               "num_classes": int(data.num_classes)}
  if unroll_steps is not None:
    signature["unrolled"] = {"batch_size": config.client.batch_size}
  return signature


def unrolled_steps(config: ExperimentConfig, backend: str, client_tensors) -> Optional[int]:
  """The most batches a client has (its last, shorter one included) where its
  client work takes them stacked (`algorithms.unrolled`), or None: TFF's loop
  over its dataset (the same bits either way). As `runtime.unroll_max_batches`
  says, where every client's batch count is known, off `tff_cpp` (TFF's runtime
  is given datasets), for the processes `_weighted_fed_avg` composes, without
  augmentation (its batches are not a gather)."""
  from tff_fedadamom.config.schema import TFF_CPP, UNROLL_MIN_BATCHES

  limit = config.runtime.unroll_max_batches
  if (limit == 0 or backend == TFF_CPP or not client_lr_in_state(config)
      or config.data.augment is not None):
    return None
  counts = client_tensors.batch_counts()  # None: not known without reading every client
  if counts is None:
    return None
  most = max(counts)
  if limit is None:
    run_batches = config.rounds * config.clients_per_round * sum(counts) / len(counts)
    return most if run_batches >= UNROLL_MIN_BATCHES else None
  return most if most <= limit else None


def make_keras_model(config: ExperimentConfig, data: FederatedData) -> tf.keras.Model:
  return models.build_model(
      config.model.name, input_shape=tuple(data.input_shape),
      num_classes=data.num_classes, seed=config.seed, **config.model.options)


def make_model_fn(config: ExperimentConfig, data: FederatedData,
                  spec=None) -> Callable[[], tff.learning.models.VariableModel]:
  spec = spec if spec is not None else input_spec(config, data)
  loss_factory, metric_factories = models.loss_and_metrics(
      models.MODELS[config.model.name].task)

  def model_fn():
    return tff.learning.models.from_keras_model(
        make_keras_model(config, data), loss=loss_factory(), input_spec=spec,
        metrics=[m() for m in metric_factories])

  return model_fn


def build_server_optimizer(config: ExperimentConfig) -> tff.learning.optimizers.Optimizer:
  """The registry optimizer with the config's hparams and learning-rate schedule."""
  from tff_fedadamom.optimizers import schedules

  server = config.server
  optimizer = methods.build_server_optimizer(server.optimizer, **server.hparams)
  kind, params = schema.split_kind(server.schedule, schema.DEFAULT_SCHEDULE_KIND)
  base_lr = server.hparams["learning_rate"]
  return schedules.with_schedule(optimizer,
                                 schedules.build_schedule(kind, base_lr, **params))


class _UniformMean(tff.aggregators.WeightedAggregationFactory):
  """A weighted-aggregation factory that ignores the weights: the plain mean
  (`build_weighted_fed_avg_with_optimizer_schedule` always weights clients by
  their number of examples; the paper averages uniformly)."""

  def create(self, value_type, weight_type):
    inner = tff.aggregators.UnweightedMeanFactory().create(value_type)

    @tff.federated_computation(
        inner.next.type_signature.parameter[0],
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      del weight
      return inner.next(state, value)

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def client_lr_in_state(config: ExperimentConfig) -> bool:
  """Whether the process keeps the client learning rate in its state:
  `build_weighted_fed_avg` does (`client_work=<learning_rate=...>`); the
  optimizer-schedule variant (a decaying rate) closes over it, and whole
  learning processes (FedCAda, FAFED) count as not keeping it."""
  return config.client.lr_decay == 1.0 and not methods.is_learning_process(
      config.server.optimizer)


def build_process(config: ExperimentConfig, data: Optional[FederatedData] = None,
                  loop_implementation=None, server_optimizer=None,
                  unroll_steps: Optional[int] = None) -> tff.learning.templates.LearningProcess:
  """Builds the TFF learning process a validated config describes: TFF's
  `build_weighted_fed_avg` (`_weighted_fed_avg`), its optimizer-schedule variant
  when the client learning rate decays, or for a `LEARNING_PROCESS` entry
  (FedCAda, FAFED) the process its builder makes.

  `data` and `server_optimizer` are the caller's, if it has them (TFF's
  optimizers hold no state, so one serves any number of processes). With
  `unroll_steps` (`unrolled_steps`), the clients' data are stacked batches and
  their steps a loop over them (`algorithms.unrolled`).
  """
  from tff_fedadamom.experiment.plan import training_loop

  if unroll_steps is not None and not client_lr_in_state(config):
    raise ValueError("unroll_steps is for processes that keep the client learning rate in "
                     "their state (see unrolled_steps)")
  data = data if data is not None else load_data(config)
  if loop_implementation is None:
    loop_implementation = training_loop(config.runtime.devices or ())
  element_spec = input_spec(config, data)
  model_fn = make_model_fn(config, data, element_spec)
  client = config.client
  uniform = config.server.client_weighting == "uniform"
  weighting = (tff.learning.ClientWeighting.UNIFORM if uniform
               else tff.learning.ClientWeighting.NUM_EXAMPLES)
  spec = methods.get_spec(config.server.optimizer)
  if spec.kind == methods.LEARNING_PROCESS:
    # The clients' rule changes too (FedCAda, FAFED): the registry entry builds
    # the whole process. Validation rejected client momentum and server schedules.
    return spec.builder(
        model_fn, client.learning_rate, client_weighting=weighting,
        client_lr_decay=client.lr_decay, weight_decay=client.weight_decay,
        clip_norm=client.clip_norm, loop_implementation=loop_implementation,
        **config.server.hparams)
  if server_optimizer is None:
    server_optimizer = build_server_optimizer(config)

  def client_optimizer_fn(lr):
    return build_client_sgd(lr, momentum=client.momentum, weight_decay=client.weight_decay,
                            clip_norm=client.clip_norm)

  if client_lr_in_state(config):
    return _weighted_fed_avg(
        model_fn, client_optimizer_fn(client.learning_rate), server_optimizer, weighting,
        loop_implementation, client_work_key=_client_work_key(
            config, data_signature(config, data, element_spec, unroll_steps), weighting,
            loop_implementation),
        stacked_batch_size=None if unroll_steps is None else client.batch_size)
  lr0, decay = client.learning_rate, client.lr_decay
  return tff.learning.algorithms.build_weighted_fed_avg_with_optimizer_schedule(
      model_fn,
      client_learning_rate_fn=lambda r: lr0 * tf.pow(decay, tf.cast(r, tf.float32)),
      client_optimizer_fn=client_optimizer_fn,
      server_optimizer_fn=server_optimizer,
      model_aggregator=_UniformMean() if uniform else None,
      loop_implementation=loop_implementation)


# Client works built in this process, by `_client_work_key`, least recently
# used first, each a function of its key alone: TFF computations hold no state.
_CLIENT_WORKS: collections.OrderedDict = collections.OrderedDict()
_CLIENT_WORKS_KEPT = 8
_CLIENT_WORKS_LOCK = threading.Lock()


def _client_work_key(config: ExperimentConfig, signature: dict, weighting,
                     loop_implementation) -> str:
  """What `build_model_delta_client_work` depends on: the model (its section,
  seed and data signature), the client options, the weighting and TFF's loop."""
  raw = config_to_dict(config)
  return json.dumps({"model": raw["model"], "seed": config.seed, "client": raw["client"],
                     "data": signature, "weighting": weighting.name,
                     "loop": loop_implementation.name}, sort_keys=True)


def _shared_client_work(key: str, build: Callable[[], tff.learning.templates.ClientWorkProcess]):
  """The client work of `key`: built once per process (`build()`), then shared."""
  with _CLIENT_WORKS_LOCK:
    client_work = lru_get(_CLIENT_WORKS, key)
  if client_work is not None:
    return client_work
  client_work = build()
  with _CLIENT_WORKS_LOCK:
    lru_put(_CLIENT_WORKS, key, client_work, _CLIENT_WORKS_KEPT)
  return client_work


def _weighted_fed_avg(model_fn, client_optimizer, server_optimizer, weighting,
                      loop_implementation, client_work_key: str,
                      stacked_batch_size: Optional[int] = None):
  """TFF's `build_weighted_fed_avg(model_fn, client_optimizer, server_optimizer,
  client_weighting=weighting, loop_implementation=...)`, the same pieces composed
  the same way (TFF 0.87's `learning/algorithms/fed_avg.py`), but for the client
  work, from `_shared_client_work`: tracing it is most of building a process, and
  it is the same for every server optimizer of one model, data signature and
  client options. `stacked_batch_size`: for `algorithms.unrolled`'s client work.
  """

  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_model_weights_fn.type_signature.result

  def build_client_work():
    if stacked_batch_size is not None:
      return build_unrolled_client_work(
          model_fn, client_optimizer, weighting, batch_size=stacked_batch_size,
          metrics_aggregator=tff.learning.metrics.sum_then_finalize)
    return tff.learning.templates.build_model_delta_client_work(
        model_fn, client_optimizer, weighting,
        metrics_aggregator=tff.learning.metrics.sum_then_finalize,
        loop_implementation=loop_implementation)

  client_work = _shared_client_work(client_work_key, build_client_work)
  aggregator = tff.aggregators.MeanFactory().create(weights_type.trainable,
                                                     tff.TensorType(np.float32))
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn,
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work, aggregator,
      tff.learning.templates.build_apply_optimizer_finalizer(server_optimizer, weights_type))
