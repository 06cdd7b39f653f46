"""TFF round overhead: the pipeline's round vs the same client work in plain TensorFlow.

Both sides train the same model on the same sampled clients' batches (same batch size,
local epochs and client optimizer), then average the deltas and take a server SGD step.
Prints seconds per round (median over timed rounds) for each and their ratio
(goal: pipeline <= 1.25x the plain loop).

    .venv/bin/python benchmarks/round_overhead.py [--rounds 6] [--clients 10] [--model cnn]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tff_fedadamom import models  # noqa: E402
from tff_fedadamom.config import load_config  # noqa: E402
from tff_fedadamom.data.sampling import sample_clients  # noqa: E402
from tff_fedadamom.pipeline import backends, build_process  # noqa: E402
from tff_fedadamom.pipeline.parts import make_plan  # noqa: E402
from tff_fedadamom.pipeline.plan import training_loop  # noqa: E402
from tff_fedadamom.pipeline.process import (client_datasets, load_data,  # noqa: E402
                                            make_client_tensors, make_keras_model)


def _config(args, output_dir):
  return load_config({
      "seed": 0, "rounds": args.rounds, "clients_per_round": args.clients,
      "output_dir": output_dir,
      "data": {"name": "fashion_mnist", "num_clients": 600, "partition": {"kind": "iid"}},
      "model": {"name": args.model},
      "client": {"learning_rate": 0.05, "batch_size": 20, "local_epochs": 1},
      "server": {"optimizer": "fedavg", "learning_rate": 1.0},
      "runtime": {"max_concurrent_clients": args.concurrency, "backend": args.backend},
  })


def _plain_round(model, loss_fn, datasets, lr):
  """FedAvg in one process: per-client SGD from the global weights, uniform mean."""
  start = [w.numpy() for w in model.trainable_variables]
  deltas = [np.zeros_like(w) for w in start]
  for ds in datasets:
    for var, value in zip(model.trainable_variables, start):
      var.assign(value)
    _train_client(model, loss_fn, ds, lr)
    for d, var, value in zip(deltas, model.trainable_variables, start):
      d += var.numpy() - value
  for var, value, d in zip(model.trainable_variables, start, deltas):
    var.assign(value + d / len(datasets))


@tf.function(reduce_retracing=True)
def _train_client(model, loss_fn, ds, lr):
  """All of one client's local steps in one graph (the fastest plain baseline)."""
  for batch in ds:
    with tf.GradientTape() as tape:
      loss = loss_fn(batch["y"], model(batch["x"], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    for var, g in zip(model.trainable_variables, grads):
      var.assign_sub(lr * g)


def main(argv=None):
  from tff_fedadamom.session import Session

  Session().apply()  # this command is its process's entry point
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=6)
  parser.add_argument("--clients", type=int, default=10)
  parser.add_argument("--model", default="cnn")
  parser.add_argument("--concurrency", type=int, default=None,
                      help="clients run at once (runtime.max_concurrent_clients)")
  parser.add_argument("--backend", default="auto", choices=["auto", "inprocess", "tff_cpp"])
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    config = _config(args, tmp)
    data = load_data(config)
    ids = list(data.train.client_ids)
    rounds = [sample_clients(ids, args.clients, 0, r) for r in range(args.rounds + 1)]
    per_client = len(list(data.train.create_tf_dataset_for_client(ids[0])))
    print(f"model {args.model}, {args.clients} clients/round x {per_client} examples, "
          f"batch 20, 1 local epoch; {args.rounds} timed rounds after 1 warm-up")

    # The process as the pipeline runs it (the config's backend: in-process by default).
    plan = make_plan(config)
    backend = backends.build_backend(
        plan, build_process(config, data, training_loop(plan.devices)),
        make_client_tensors(config, data))
    state = backend.initialize()
    tff_times = []
    for r, clients in enumerate(rounds):
      t0 = time.perf_counter()
      state = backend.next_for_clients(state, clients, r).state
      tff_times.append(time.perf_counter() - t0)
    backend.close()  # tff_cpp: its worker_binary

    model = make_keras_model(config, data)
    loss_fn = models.loss_and_metrics("classification")[0]()
    plain_times = []
    for r, clients in enumerate(rounds):
      t0 = time.perf_counter()
      _plain_round(model, loss_fn, client_datasets(config, data, clients, r), 0.05)
      plain_times.append(time.perf_counter() - t0)

  tff_s = statistics.median(tff_times[1:])
  plain_s = statistics.median(plain_times[1:])
  print(f"pipeline (TFF) round: {tff_s:.3f} s   (first round {tff_times[0]:.2f} s)")
  print(f"plain TF loop round:  {plain_s:.3f} s   (first round {plain_times[0]:.2f} s)")
  ratio = tff_s / plain_s
  print(f"ratio pipeline/plain: {ratio:.2f}  (goal <= 1.25: {'met' if ratio <= 1.25 else 'NOT met'})")


if __name__ == "__main__":
  main()
