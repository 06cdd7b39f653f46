"""A round's cost against its floor: in-process, TFF's C++ runtime, and the same
arithmetic in one `tf.function`.

For each config, the same sampled clients train from the same global weights:

* `inprocess`: the pipeline's round (`next_for_clients` on the in-process
  backend) as a run's rounds become after `runtime.fuse_after_rounds`: one
  TensorFlow call (`pipeline.backends.fused_round`), here from the first round,
  with the clients' batches stacked, as a long run's are (`stacked`: the most
  a client has; `runtime.unroll_max_batches`);
* `loop`: where `inprocess` is stacked, the same round on TFF's client loop
  over each client's dataset (`unroll_max_batches: 0`; the same bits), else `=`;
* `call by call`: the same round as 2K + 4 calls from Python, as a run's first
  rounds are made (`fuse_after_rounds=None`; the same bits);
* `tff_cpp`: TFF's own runtime on the same learning process and batches;
* `floor`: the clients' SGD steps over the same batches, materialized
  beforehand, plus the mean of their deltas, in one `tf.function` (the
  arithmetic of a FedAvg round with nothing around it; the steps unrolled);
* `iterator floor`: the floor's steps reading the same batches from a
  `tf.data` iterator in TFF's own client loop, as the learning process's
  `work` reads its client data (a `tf.data.Dataset`, TFF's sequence type):
  what any round on TFF's client work pays besides its steps, with no
  shuffle, metrics or function calls;
* `drawn floor`: the floor's steps over each round's batches drawn in-graph
  from the client's examples and round seed (the pipeline's shuffle order,
  `ClientTensors.stacked_element`, what an unrolled client is given), each
  batch gathered as it is read in a `tf.while_loop`; checked to be the
  pipeline's batches;
* `tff update`: TFF's own client update over the floor's materialized
  batches, unrolled as the floor's steps are: what TFF's per-step
  bookkeeping (metrics, client optimizer, delta checks) adds to the floor;
* `tff drawn` (printed as its ratio to the floor): the same update over the
  batches drawn in-graph as a stacked client is given them, each client's
  steps written out for its known number of batches: what TFF's update and
  the pipeline's batches cost with nothing around them.

Prints ms per round (median of the timed rounds, after one warm-up round each)
and the ratios measured in this run, among them `inproc/iterator`: the
pipeline's round against the least a round on TFF's client loop costs. Every
timed round does the same work (the same clients, batches and ops), and the
rounds are interleaved. The floors start each round from the same weights;
the backends' rounds start from the state their last round returned, as a
run's rounds do.

    .venv/bin/python benchmarks/round_floor.py [--rounds 10] [--configs logistic,mlp,cnn,char_lstm]
    .venv/bin/python benchmarks/round_floor.py --configs resnet18 --rounds 4
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
from typing import Callable, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tff_fedadamom.session import Session  # noqa: E402

Session().apply()  # this script is its process's entry point

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from benchmarks.timing import interleaved  # noqa: E402
from tests.data.fixtures import write_cifar10  # noqa: E402
from tff_fedadamom import models  # noqa: E402
from tff_fedadamom.algorithms._common import training_loop  # noqa: E402
from tff_fedadamom.config import load_config  # noqa: E402
from tff_fedadamom.config.schema import INPROCESS, TFF_CPP  # noqa: E402
from tff_fedadamom.data.client_tensors import STATIC_OPTIONS  # noqa: E402
from tff_fedadamom.data.sampling import UniformSampler  # noqa: E402
from tff_fedadamom.optimizers.client import build_client_sgd  # noqa: E402
from tff_fedadamom.pipeline import parts as parts_lib  # noqa: E402
from tff_fedadamom.pipeline import plan as plan_lib  # noqa: E402
from tff_fedadamom.pipeline import process as process_lib  # noqa: E402

# The four configs of the round-speed goals: the quickstart sweep's trials, the
# paper study's two models, and the quickstart CNN.
CONFIGS = {
    "logistic": dict(clients_per_round=5, data={"name": "digits", "num_clients": 20},
                     model={"name": "logistic"},
                     client={"learning_rate": 0.1, "batch_size": 20}),
    "mlp": dict(clients_per_round=5, data={"name": "fashion_mnist", "num_clients": 100},
                model={"name": "mlp", "options": {"hidden": [64]}},
                client={"learning_rate": 0.05, "batch_size": 20}),
    "cnn": dict(clients_per_round=10, data={"name": "fashion_mnist", "num_clients": 100},
                model={"name": "cnn"},
                client={"learning_rate": 0.05, "batch_size": 32, "max_examples": 200}),
    "char_lstm": dict(clients_per_round=5,
                      data={"name": "shakespeare",
                            "options": {"max_clients": 100, "seq_length": 20}},
                      model={"name": "char_lstm",
                             "options": {"embedding_dim": 8, "lstm_units": 64}},
                      client={"learning_rate": 1.0, "batch_size": 10, "max_examples": 200,
                              "local_epochs": 2, "clip_norm": 10.0}),
}


# Opt-in (`--configs resnet18`): ResNet-18 (GroupNorm) on generated CIFAR-format
# images, 5 clients x 100 images, batch 50, one local epoch (backend.py's case b
# without its decay, weight decay, clipping and augmentation, which the floor's
# plain SGD steps do not do).
EXTRA_CONFIGS = {
    "resnet18": dict(clients_per_round=5,
                     data={"name": "cifar10", "num_clients": 5, "partition": {"kind": "iid"}},
                     model={"name": "resnet18"},
                     client={"learning_rate": 0.1, "batch_size": 50, "max_examples": 100}),
}
# Data files a config reads from its temporary directory (`data.path`).
DATA_FILES = {"resnet18": lambda root: write_cifar10(root, per_batch=100, test=10, seed=0)}


def _config(name: str, backend: str, output_dir: str, unroll_max_batches: Optional[int] = None):
  runtime = {"backend": backend, "fuse_after_rounds": 0}
  if unroll_max_batches is not None:
    runtime["unroll_max_batches"] = unroll_max_batches
  # A long run's rounds (the goals are about those): a run that trains
  # UNROLL_MIN_BATCHES batches or more stacks its clients' batches.
  raw = {"seed": 0, "rounds": 1000, "output_dir": output_dir, "telemetry": False,
         "server": {"optimizer": "fedavg", "learning_rate": 1.0,
                    "client_weighting": "uniform"},
         "runtime": runtime,
         **{**CONFIGS, **EXTRA_CONFIGS}[name]}
  if name in DATA_FILES:
    raw["data"] = {**raw["data"], "path": output_dir}
  return load_config(raw)


def _sgd(config, data):
  """The config's Keras model, the round's start weights, and one plain SGD step on it."""
  model = process_lib.make_keras_model(config, data)
  loss_fn = models.loss_and_metrics(models.MODELS[config.model.name].task)[0]()
  lr = config.client.learning_rate
  start = [tf.identity(v) for v in model.trainable_variables]

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    for var, grad in zip(model.trainable_variables,
                         tape.gradient(loss, model.trainable_variables)):
      var.assign_sub(lr * tf.convert_to_tensor(grad))

  return model, start, step


def _round_fn(config, data, clients: Sequence, train_client: Callable):
  """A `tf.function` of FedAvg's arithmetic: for each of `clients`, the start
  weights, `train_client(client, step)`, its delta; the start plus their mean."""
  model, start, step = _sgd(config, data)

  @tf.function
  def round_fn():
    deltas = [tf.zeros_like(v) for v in start]
    for client in clients:
      for var, value in zip(model.trainable_variables, start):
        var.assign(value)
      train_client(client, step)
      deltas = [d + v - s for d, v, s in zip(deltas, model.trainable_variables, start)]
    return [s + d / len(clients) for s, d in zip(start, deltas)]

  return round_fn


def _batches(tensors, clients) -> list[list[tuple]]:
  """Each client's round-1 batches as the pipeline makes them (from `tensors`,
  its `ClientTensors`), materialized."""
  return [[(b["x"], b["y"]) for b in ds] for ds in tensors.datasets(clients, 1)]


def _floor(config, data, batches):
  """The floor: the steps over `batches` (`_batches`), unrolled."""
  def train(client_batches, step):
    for x, y in client_batches:
      step(x, y)

  return _round_fn(config, data, batches, train)


def _iterator_floor(config, data, batches):
  """The floor's steps reading the same batches from a `tf.data` iterator, in
  TFF's own client loop (the one the learning process's `work` runs), over a
  dataset of the batches as they are: the least a client computation whose
  data is a `tf.data.Dataset` (TFF's sequence type) does besides its steps."""
  loop = training_loop(plan_lib.training_loop(()))

  def dataset(client_batches):
    """A client's batches, in order: the full ones sliced from one stacked tensor each."""
    full = [b for b in client_batches if b[0].shape[0] == config.client.batch_size]
    parts = ([tf.data.Dataset.from_tensor_slices(tuple(tf.stack(t) for t in zip(*full)))]
             if full else [])
    parts += [tf.data.Dataset.from_tensors(last) for last in client_batches[len(full):]]
    ds = parts[0]
    for part in parts[1:]:
      ds = ds.concatenate(part)
    return ds.with_options(STATIC_OPTIONS)

  def train(client_batches, step):
    loop(lambda state, batch: (step(*batch), state)[1], dataset(client_batches),
         lambda: tf.constant(0))

  return _round_fn(config, data, batches, train)


def _tff_update_floor(config, data, batches, tensors=None, clients=()):
  """TFF's own client update (`model_delta_client_work`: the model's
  `forward_pass` with its metrics, the client optimizer, the delta and its
  non-finite check, the client weight) over the floor's materialized batches,
  handed to it as a Python list so that TFF's loop unrolls like the floor's,
  then the mean of the updates: TFF's per-step bookkeeping on top of the
  floor, with no loop over the batches.

  With `tensors` (the `ClientTensors`) and `clients`: over each round's
  batches drawn in-graph as a stacked client is given them
  (`ClientTensors.stacked_element`), each client's known number of them
  written out: the least a round on TFF's update over the pipeline's batches
  costs, with no loop, guard, function call, server or Python around it."""
  from tensorflow_federated.python.learning.templates import model_delta_client_work

  uniform = config.server.client_weighting == "uniform"
  update = model_delta_client_work.build_model_delta_update_with_tff_optimizer(
      process_lib.make_model_fn(config, data),
      weighting=tff.learning.ClientWeighting.UNIFORM if uniform
      else tff.learning.ClientWeighting.NUM_EXAMPLES,
      loop_implementation=plan_lib.training_loop(()))
  client = config.client
  optimizer = build_client_sgd(client.learning_rate, momentum=client.momentum,
                               weight_decay=client.weight_decay, clip_norm=client.clip_norm)
  model = process_lib.make_keras_model(config, data)
  start = tff.learning.models.ModelWeights(
      [tf.identity(v) for v in model.trainable_variables],
      [tf.identity(v) for v in model.non_trainable_variables])
  # Each client's (full batches, whether a last, shorter one follows).
  counts = [(sum(x.shape[0] == client.batch_size for x, _ in b),
             b[-1][0].shape[0] != client.batch_size) for b in batches]
  batches = [[collections.OrderedDict(x=x, y=y) for x, y in client_batches]
             for client_batches in batches]

  def drawn(client_args, full_count, has_last):
    from tff_fedadamom.data.client_tensors import FULL, LAST, batch_of

    element = tensors.stacked_element(*client_args)
    return ([batch_of(element, element[FULL][i]) for i in range(full_count)]
            + ([batch_of(element, element[LAST])] if has_last else []))

  @tf.function
  def round_fn():
    client_batches = batches if tensors is None else [
        drawn(tensors.args(cid, 1), *count) for cid, count in zip(clients, counts)]
    updates = [update(optimizer, start, b)[0].update for b in client_batches]
    return [s - tf.add_n(list(u)) / len(updates) for s, u in zip(start.trainable, zip(*updates))]

  return round_fn


def _drawn_floor(config, data, tensors, clients, batches):
  """The floor's steps over each round's batches drawn in-graph from the
  client's examples and round seed (`ClientTensors.stacked_element`: the
  pipeline's shuffle order), each gathered as it is read in a
  `tf.while_loop`: the pipeline's batches without `tf.data` iteration.
  Checked here to be the pipeline's `batches` (`_batches`)."""
  from tff_fedadamom.data.client_tensors import FULL, LAST, batch_of, stacked_batches

  args = [tensors.args(cid, 1) for cid in clients]

  def train(client_args, step):
    element = tensors.stacked_element(*client_args)
    full, last = element[FULL], element[LAST]
    for i in tf.range(tf.shape(full)[0]):
      step(*batch_of(element, full[i]).values())
    if tf.shape(last)[0] > 0:
      step(*batch_of(element, last).values())

  for client_args, client_batches in zip(args, batches):
    drawn = [tuple(b.values()) for b in stacked_batches(tensors.stacked_element(*client_args))]
    if len(drawn) != len(client_batches) or not all(
        np.array_equal(a, b) for d, p in zip(drawn, client_batches) for a, b in zip(d, p)):
      raise AssertionError("the drawn batches are not the pipeline's")
  return _round_fn(config, data, args, train)


def _backend_round(config, data, clients):
  """A callable running one round on `config`'s backend, and the process to close.

  Each round starts from the state the last one returned, as a run's rounds do
  (a backend may keep what it needs of the state it returned); the clients,
  batches and ops are the same every round, so is the work.
  """
  parts = parts_lib.build_parts(config, data=data)
  state = [parts_lib.initial_state(config, parts.process)]

  def round_fn():
    state[0] = parts.process.next_for_clients(state[0], clients, 1).state

  return round_fn, parts.process


def _call_by_call_round(config, data, clients):
  """The in-process round as 2K + 4 calls (`fuse_after_rounds=None`)."""
  from tff_fedadamom.pipeline.backends.inprocess import InProcessLearningProcess

  compiled = parts_lib.learning_process(config, data)
  process = InProcessLearningProcess(
      compiled, client_tensors=process_lib.make_client_tensors(config, data),
      fuse_after_rounds=None)
  state = parts_lib.initial_state(config, process)
  return lambda: process.next_for_clients(state, clients, 1)


def measure(name: str, rounds: int) -> dict[str, float]:
  with tempfile.TemporaryDirectory() as tmp:
    if name in DATA_FILES:
      DATA_FILES[name](tmp)
    config = _config(name, INPROCESS, tmp)
    data = process_lib.load_data(config)
    clients = UniformSampler(data.train.client_ids, config.clients_per_round, config.seed)(1)
    tensors = process_lib.make_client_tensors(config, data)
    batches = _batches(tensors, clients)
    fns = {"floor": _floor(config, data, batches),
           "iterator": _iterator_floor(config, data, batches),
           "drawn": _drawn_floor(config, data, tensors, clients, batches),
           "tff update": _tff_update_floor(config, data, batches),
           "tff drawn": _tff_update_floor(config, data, batches, tensors, clients),
           "call": _call_by_call_round(config, data, clients)}
    steps = process_lib.unrolled_steps(config, INPROCESS, tensors)
    processes = []
    try:
      for backend in (INPROCESS, TFF_CPP):
        fns[backend], process = _backend_round(_config(name, backend, tmp), data, clients)
        processes.append(process)
      if steps is not None:  # the same round on TFF's client loop
        fns["loop"], process = _backend_round(_config(name, INPROCESS, tmp, 0), data, clients)
        processes.append(process)
      ms = {name: 1000 * statistics.median(t) for name, t in interleaved(fns, rounds).items()}
      return {**ms, "steps": steps}
    finally:
      for process in processes:
        process.close()


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=10, help="timed rounds per measurement")
  parser.add_argument("--configs", default=",".join(CONFIGS),
                      help=f"comma-separated, of {', '.join([*CONFIGS, *EXTRA_CONFIGS])}")
  args = parser.parse_args(argv)
  columns = {  # heading: (width, the figure from a measurement's ms)
      "stacked": (11, lambda m: "no" if m["steps"] is None else f"{m['steps']} batches"),
      "inprocess ms": (13, lambda m: f"{m['inprocess']:.1f}"),
      "loop ms": (8, lambda m: f"{m['loop']:.1f}" if "loop" in m else "="),
      "call-by-call ms": (16, lambda m: f"{m['call']:.1f}"),
      "tff_cpp ms": (11, lambda m: f"{m['tff_cpp']:.1f}"),
      "floor ms": (9, lambda m: f"{m['floor']:.1f}"),
      "iterator floor": (15, lambda m: f"{m['iterator']:.1f}"),
      "drawn floor": (12, lambda m: f"{m['drawn']:.1f}"),
      "tff update ms": (14, lambda m: f"{m['tff update']:.1f}"),
      "inproc/floor": (13, lambda m: f"{m['inprocess'] / m['floor']:.2f}"),
      "iterator/floor": (15, lambda m: f"{m['iterator'] / m['floor']:.2f}"),
      "drawn/floor": (12, lambda m: f"{m['drawn'] / m['floor']:.2f}"),
      "tff update/floor": (17, lambda m: f"{m['tff update'] / m['floor']:.2f}"),
      "tff drawn/floor": (16, lambda m: f"{m['tff drawn'] / m['floor']:.2f}"),
      "inproc/iterator": (16, lambda m: f"{m['inprocess'] / m['iterator']:.2f}"),
      "loop/inproc": (12, lambda m: f"{m['loop'] / m['inprocess']:.2f}" if "loop" in m else "="),
      "call/inproc": (12, lambda m: f"{m['call'] / m['inprocess']:.2f}"),
      "cpp/inproc": (11, lambda m: f"{m['tff_cpp'] / m['inprocess']:.2f}"),
  }
  print(f"{'config':<10}" + "".join(f" {h:>{w}}" for h, (w, _) in columns.items()))
  for name in args.configs.split(","):
    m = measure(name, args.rounds)
    print(f"{name:<10}" + "".join(f" {f(m):>{w}}" for w, f in columns.values()), flush=True)


if __name__ == "__main__":
  main()
