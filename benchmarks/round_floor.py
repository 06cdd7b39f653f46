"""A round's cost against its floor: in-process, TFF's C++ runtime, and the same
arithmetic in one `tf.function`.

For each config, the same sampled clients train from the same global weights:

* `inprocess`: the pipeline's round (`next_for_clients` on the in-process
  backend) as a run's rounds become after `runtime.fuse_after_rounds`: one
  TensorFlow call (`pipeline.backends.fused_round`), here from the first round;
* `call by call`: the same round as 2K + 4 calls from Python, as a run's first
  rounds are made (`fuse_after_rounds=None`; the same bits);
* `tff_cpp`: TFF's own runtime on the same learning process and batches;
* `floor`: the clients' SGD steps over the same batches, materialized
  beforehand, plus the mean of their deltas, in one `tf.function` (the
  arithmetic of a FedAvg round with nothing around it).

Prints ms per round (median of the timed rounds, after one warm-up round each)
and the ratios measured in this run. Every timed round starts from the same
state, so all four do the same work each time, and their rounds are
interleaved.

    .venv/bin/python benchmarks/round_floor.py [--rounds 10] [--configs logistic,mlp,cnn,char_lstm]
    .venv/bin/python benchmarks/round_floor.py --configs resnet18 --rounds 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tff_fedadamom.session import Session  # noqa: E402

Session().apply()  # this script is its process's entry point

import tensorflow as tf  # noqa: E402

from benchmarks.timing import interleaved  # noqa: E402
from tests.data.fixtures import write_cifar10  # noqa: E402
from tff_fedadamom import models  # noqa: E402
from tff_fedadamom.config import load_config  # noqa: E402
from tff_fedadamom.config.schema import INPROCESS, TFF_CPP  # noqa: E402
from tff_fedadamom.data.sampling import UniformSampler  # noqa: E402
from tff_fedadamom.pipeline import parts as parts_lib  # noqa: E402
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


def _config(name: str, backend: str, output_dir: str):
  raw = {"seed": 0, "rounds": 1, "output_dir": output_dir, "telemetry": False,
         "server": {"optimizer": "fedavg", "learning_rate": 1.0,
                    "client_weighting": "uniform"},
         "runtime": {"backend": backend, "fuse_after_rounds": 0},
         **{**CONFIGS, **EXTRA_CONFIGS}[name]}
  if name in DATA_FILES:
    raw["data"] = {**raw["data"], "path": output_dir}
  return load_config(raw)


def _floor(config, data, clients):
  """A callable running the round's arithmetic in one `tf.function`."""
  model = process_lib.make_keras_model(config, data)
  loss_fn = models.loss_and_metrics(models.MODELS[config.model.name].task)[0]()
  tensors = process_lib.make_client_tensors(config, data)
  batches = [[(b["x"], b["y"]) for b in ds] for ds in tensors.datasets(clients, 1)]
  lr = config.client.learning_rate
  start = [tf.identity(v) for v in model.trainable_variables]

  @tf.function
  def round_fn():
    deltas = [tf.zeros_like(v) for v in start]
    for client in batches:
      for var, value in zip(model.trainable_variables, start):
        var.assign(value)
      for x, y in client:
        with tf.GradientTape() as tape:
          loss = loss_fn(y, model(x, training=True))
        for var, grad in zip(model.trainable_variables,
                             tape.gradient(loss, model.trainable_variables)):
          var.assign_sub(lr * tf.convert_to_tensor(grad))
      deltas = [d + v - s for d, v, s in zip(deltas, model.trainable_variables, start)]
    return [s + d / len(batches) for s, d in zip(start, deltas)]

  return round_fn


def _backend_round(config, data, clients):
  """A callable running one round on `config`'s backend, and the process to close."""
  parts = parts_lib.build_parts(config, data=data)
  state = parts_lib.initial_state(config, parts.process)
  return lambda: parts.process.next_for_clients(state, clients, 1), parts.process


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
    fns = {"floor": _floor(config, data, clients),
           "call": _call_by_call_round(config, data, clients)}
    processes = []
    try:
      for backend in (INPROCESS, TFF_CPP):
        fns[backend], process = _backend_round(_config(name, backend, tmp), data, clients)
        processes.append(process)
      return {name: 1000 * statistics.median(t) for name, t in interleaved(fns, rounds).items()}
    finally:
      for process in processes:
        process.close()


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=10, help="timed rounds per measurement")
  parser.add_argument("--configs", default=",".join(CONFIGS),
                      help=f"comma-separated, of {', '.join([*CONFIGS, *EXTRA_CONFIGS])}")
  args = parser.parse_args(argv)
  print(f"{'config':<10} {'inprocess ms':>13} {'call-by-call ms':>16} {'tff_cpp ms':>11} "
        f"{'floor ms':>9} {'inproc/floor':>13} {'call/inproc':>12} {'cpp/inproc':>11}")
  for name in args.configs.split(","):
    m = measure(name, args.rounds)
    print(f"{name:<10} {m['inprocess']:>13.1f} {m['call']:>16.1f} {m['tff_cpp']:>11.1f} "
          f"{m['floor']:>9.1f} {m['inprocess'] / m['floor']:>13.2f} "
          f"{m['call'] / m['inprocess']:>12.2f} {m['tff_cpp'] / m['inprocess']:>11.2f}",
          flush=True)


if __name__ == "__main__":
  main()
