"""A candidate round design against today's: TFF's client update unrolled over
a client's batches, handed over as one `tf.data` element.

Why: on digits/logistic a round on TFF's client loop cannot come within 2x of
its floor (`round_floor.py`: reading the batches from a `tf.data` iterator
alone is about 2.5x), while TFF's client update itself, unrolled over the same
batches, is about 1.07x. TFF's `ClientWorkProcess` only takes client data that
is a sequence (or a structure of sequences), so here the sequence has a single
element, the client's round batches stacked (`[N - 1, batch]` full batches
plus the last one), read with one `get_single_element`, and the update is
unrolled over its N batches. The learning process is otherwise today's
(`process._weighted_fed_avg`'s pieces), compiled to MapReduceForm and run as
the in-process fused round, with each client's batches drawn in-graph from
its examples and round seed (`round_floor._drawn_order`).

The catch, and why it is a benchmark and not the pipeline: N is part of the
process's type, so a run needs one process per distinct client batch count,
and one fused round per combination of counts among a round's clients. Here
every client has the same count (the data split i.i.d.).

Prints ms per round of the floor, today's round and the candidate's (one run,
interleaved), their ratios, and whether the candidate's new weights and
training metrics equal today's bit for bit.

    .venv/bin/python benchmarks/unrolled_round.py [--config logistic|mlp] [--rounds 40]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tff_fedadamom.session import Session  # noqa: E402

Session().apply()  # this script is its process's entry point

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from benchmarks.round_floor import _batches, _drawn_order, _floor  # noqa: E402
from benchmarks.timing import interleaved  # noqa: E402
from tff_fedadamom.config import load_config  # noqa: E402
from tff_fedadamom.data.sampling import UniformSampler  # noqa: E402
from tff_fedadamom.optimizers.client import build_client_sgd  # noqa: E402
from tff_fedadamom.pipeline import parts as parts_lib  # noqa: E402
from tff_fedadamom.pipeline import plan as plan_lib  # noqa: E402
from tff_fedadamom.pipeline import process as process_lib  # noqa: E402
from tff_fedadamom.pipeline.backends.fused_round import FusedRound  # noqa: E402
from tff_fedadamom.pipeline.backends.inprocess import InProcessLearningProcess  # noqa: E402
from tff_fedadamom.pipeline.py_containers import flatten_value, type_leaves  # noqa: E402
from tff_fedadamom.pipeline.tf_computation import Feed  # noqa: E402

# `round_floor.py`'s logistic and MLP configs, split i.i.d. so that every client
# has the same number of batches (digits: 4, Fashion-MNIST: 30).
CONFIGS = {
    "logistic": {"data": {"name": "digits", "num_clients": 20, "partition": {"kind": "iid"}},
                 "model": {"name": "logistic"},
                 "client": {"learning_rate": 0.1, "batch_size": 20}},
    "mlp": {"data": {"name": "fashion_mnist", "num_clients": 100, "partition": {"kind": "iid"}},
            "model": {"name": "mlp", "options": {"hidden": [64]}},
            "client": {"learning_rate": 0.05, "batch_size": 20}},
}
COMMON = {"seed": 0, "rounds": 1, "telemetry": False, "clients_per_round": 5,
          "server": {"optimizer": "fedavg", "learning_rate": 1.0, "client_weighting": "uniform"},
          "runtime": {"backend": "inprocess", "fuse_after_rounds": 0, "cache": False}}


def _element_spec(input_spec, batches: int, size: int) -> collections.OrderedDict:
  """The one element of a client's sequence: `batches - 1` full batches stacked, and the last."""
  x, y = input_spec["x"], input_spec["y"]
  return collections.OrderedDict(
      xf=tf.TensorSpec([batches - 1, size, *x.shape[1:]], x.dtype),
      yf=tf.TensorSpec([batches - 1, size, *y.shape[1:]], y.dtype),
      xl=tf.TensorSpec(x.shape, x.dtype), yl=tf.TensorSpec(y.shape, y.dtype))


def unrolled_client_work(model_fn, optimizer, batches: int, size: int):
  """TFF's `build_model_delta_client_work`, with the client data one element
  of `batches` stacked batches and TFF's update unrolled over them."""
  from tensorflow_federated.python.learning.templates import model_delta_client_work

  with tf.Graph().as_default():
    model = model_fn()
    metrics = tff.learning.metrics.sum_then_finalize(model.metric_finalizers())
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(
      _element_spec(model.input_spec, batches, size)))
  weights_type = tff.learning.models.weights_type_from_model(model)
  hparams = optimizer.get_hparams(optimizer.initialize(tf.TensorSpec((), tf.float32)))

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(hparams, tff.SERVER)

  state_type = init_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type, weights_type, data_type)
  def client_update(state, weights, dataset):
    update = model_delta_client_work.build_model_delta_update_with_tff_optimizer(
        model_fn=model_fn, weighting=tff.learning.ClientWeighting.UNIFORM,
        loop_implementation=plan_lib.training_loop(()))
    e = dataset.get_single_element()
    steps = [collections.OrderedDict(x=e["xf"][i], y=e["yf"][i]) for i in range(batches - 1)]
    return update(optimizer, weights, [*steps, collections.OrderedDict(x=e["xl"], y=e["yl"])],
                  state)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(weights_type, tff.CLIENTS),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    result, outputs = tff.federated_map(
        client_update, (tff.federated_broadcast(state), weights, client_data))
    measurements = tff.federated_zip(collections.OrderedDict(train=metrics(outputs)))
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  return tff.learning.templates.ClientWorkProcess(
      init_fn, next_fn,
      get_hparams_fn=tff.tensorflow.computation(lambda s: s, state_type),
      set_hparams_fn=tff.tensorflow.computation(lambda s, h: h, state_type, state_type))


def unrolled_process(config, data, batches: int):
  """Today's FedAvg process (`process._weighted_fed_avg`'s pieces) with the unrolled client work."""
  model_fn = process_lib.make_model_fn(config, data)

  @tff.tensorflow.computation()
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_weights.type_signature.result
  client_work = unrolled_client_work(model_fn, build_client_sgd(config.client.learning_rate),
                                     batches, config.client.batch_size)
  return tff.learning.templates.compose_learning_process(
      initial_weights, tff.learning.templates.build_broadcast_process(weights_type),
      client_work, tff.aggregators.MeanFactory().create(weights_type.trainable,
                                                        tff.TensorType(np.float32)),
      tff.learning.templates.build_apply_optimizer_finalizer(
          process_lib.build_server_optimizer(config), weights_type))


def stacked_feed(tensors, batches: int, size: int) -> Feed:
  """A client's one-element dataset from its examples and round seed, in-graph."""
  def to_params(*args):
    x, y, order = _drawn_order(tensors, 1, args[:-1], args[-1])
    full = (batches - 1) * size
    element = collections.OrderedDict(
        xf=tf.reshape(tf.gather(x, order[:full]), [batches - 1, size, *x.shape[1:]]),
        yf=tf.reshape(tf.gather(y, order[:full]), [batches - 1, size, *y.shape[1:]]),
        xl=tf.gather(x, order[full:]), yl=tf.gather(y, order[full:]))
    return [tf.data.Dataset.from_tensors(element)._variant_tensor]  # noqa: SLF001

  return Feed(tensors.signature, 1, to_params)


def _same(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=40, help="timed rounds per variant")
  parser.add_argument("--config", choices=sorted(CONFIGS), default="logistic")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    config = load_config({**COMMON, **CONFIGS[args.config], "output_dir": tmp})
    data = process_lib.load_data(config)
    clients = UniformSampler(data.train.client_ids, config.clients_per_round, config.seed)(1)
    tensors = process_lib.make_client_tensors(config, data)
    size = config.client.batch_size
    counts = {-(-int(tensors.examples(c)[0].shape[0]) // size) for c in clients}
    if len(counts) != 1:
      raise SystemExit(f"the clients' batch counts differ ({sorted(counts)}); this needs one")
    (batches,) = counts
    parts = parts_lib.build_parts(config, data=data)
    state = parts_lib.initial_state(config, parts.process)
    candidate = InProcessLearningProcess(unrolled_process(config, data, batches),
                                         devices=parts.process.devices)
    start = candidate.initialize()
    fused = FusedRound(candidate.compiled, parts.process.devices, len(clients),
                       stacked_feed(tensors, batches, size),
                       [tf.TensorSpec(t.shape, t.dtype) for t in type_leaves(candidate.state_type)],
                       len(clients))
    flat = flatten_value(start, candidate.state_type, [])
    client_args = [tensors.args(c, 1) for c in clients]
    fns = {"floor": _floor(config, data, _batches(tensors, clients)),
           "today": lambda: parts.process.next_for_clients(state, clients, 1),
           "unrolled": lambda: fused(flat, client_args)}
    ms = {k: 1000 * statistics.median(t) for k, t in interleaved(fns, args.rounds).items()}
    today = parts.process.next_for_clients(state, clients, 1)
    unrolled = candidate.server.to_python(fused(flat, client_args))
  print(f"{args.config}, {len(clients)} clients of {batches} batches, ms per round: floor "
        f"{ms['floor']:.2f}, today {ms['today']:.2f}, unrolled {ms['unrolled']:.2f}; "
        f"today/floor {ms['today'] / ms['floor']:.2f}, unrolled/floor "
        f"{ms['unrolled'] / ms['floor']:.2f}, today/unrolled {ms['today'] / ms['unrolled']:.2f}")
  print("same start:", _same(state.global_model_weights.trainable,
                             start.global_model_weights.trainable),
        "| same weights after the round:", _same(today.state.global_model_weights.trainable,
                                                  unrolled.state.global_model_weights.trainable),
        "| same training metrics:", today.metrics["client_work"]["train"]
        == unrolled.metrics["client_work"]["train"])


if __name__ == "__main__":
  main()
