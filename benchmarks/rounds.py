"""A round's time on each backend against its floor, and memory over a long run.

    python -m benchmarks.rounds [--configs logistic,mlp,cnn] [--rounds 8] [--memory-rounds 1000]

A backend's time is its run's round as the run makes it (an `iter_experiment`
generator stepped one round at a time: sampling, the round, its metrics row).
The timed rounds hold no evaluation and no checkpoint, and the clients are IID
with equal example counts, so every round trains the same number of batches.
The floor (`floor_round`) is the round's arithmetic alone: backend / floor is
what a backend costs above it. The floor trains its clients one after another,
one thread per kernel: a backend that trains clients side by side on several
cores (ray's actors) can beat it on a large model. In the memory run, a function
traced per round would show in TensorFlow's function count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from benchmarks import common
from tff_fedadamom.experiment.outputs import markdown_table

BACKENDS = {
    "inprocess": {"backend": "inprocess"},
    "ray": {"backend": "ray", "workers": 2, "cpus_per_worker": 1, "threads": 1},
    "tff_cpp": {"backend": "tff_cpp"},
    # Asynchronous server steps (`runtime.buffered`), in-process, on the same work
    # per step: the round's clients_per_round updates. `async0` has no delay (the
    # synchronous run's bits); `async` twice as many clients in flight with
    # lognormal speeds, so each step's updates train from several model versions.
    "async0": {"backend": "inprocess", "asynchronous": {"durations": {"kind": "constant"}}},
    "async": {"backend": "inprocess", "asynchronous": {"concurrency": "2x"}},
}
# IID clients, `max_examples` each (every client has at least that many).
CONFIGS = {
    "logistic": dict(clients_per_round=5, data={"name": "digits", "num_clients": 20},
                     model={"name": "logistic"},
                     client={"learning_rate": 0.1, "batch_size": 20, "max_examples": 60}),
    "mlp": dict(clients_per_round=5, data={"name": "fashion_mnist", "num_clients": 100},
                model={"name": "mlp", "options": {"hidden": [64]}},
                client={"learning_rate": 0.05, "batch_size": 20, "max_examples": 200}),
    "cnn": dict(clients_per_round=10, data={"name": "fashion_mnist", "num_clients": 100},
                model={"name": "cnn"},
                client={"learning_rate": 0.05, "batch_size": 32, "max_examples": 200}),
}
ASYNC = ("async0", "async")
WARMUPS = 2
MEMORY_MARK = 100
MEMORY_GOAL_MB = 5.0


def config_dict(name: str, backend: str, rounds: int, output_dir: str) -> dict:
  """The experiment of config `name` on `backend`: evaluation and checkpoint at
  the last round only, no telemetry, FedAvg with uniform client weights."""
  runtime = dict(BACKENDS[backend])
  asynchronous = runtime.pop("asynchronous", None)
  if asynchronous and asynchronous.get("concurrency") == "2x":
    asynchronous = {"concurrency": 2 * CONFIGS[name]["clients_per_round"]}
  return {"seed": 0, "rounds": rounds, "eval_every": rounds, "checkpoint_every": rounds,
          "output_dir": output_dir, "telemetry": False,
          "server": {"optimizer": "fedavg", "learning_rate": 1.0, "client_weighting": "uniform"},
          "runtime": runtime, **CONFIGS[name], **({"asynchronous": asynchronous}
                                                  if asynchronous else {}),
          "data": {**CONFIGS[name]["data"], "partition": {"kind": "iid"}}}


def floor_round(raw: dict):
  """A call of the round's arithmetic with nothing around it, in one `tf.function`:
  the same SGD steps over the same batches (round 1's clients, materialized
  beforehand), each client from the same start weights, then the start plus the
  mean of the clients' deltas."""
  import tensorflow as tf

  from tff_fedadamom import models
  from tff_fedadamom.config import load_config
  from tff_fedadamom.data.sampling import UniformSampler
  from tff_fedadamom.experiment import process

  config = load_config(raw)
  data = process.load_data(config)
  clients = UniformSampler(data.train.client_ids, config.clients_per_round, config.seed)(1)
  batches = [[(b["x"], b["y"]) for b in ds]
             for ds in process.client_datasets(config, data, clients, 1)]
  model = process.make_keras_model(config, data)
  loss_fn = models.loss_and_metrics(models.MODELS[config.model.name].task)[0]()
  variables, lr = model.trainable_variables, config.client.learning_rate
  start = [tf.identity(v) for v in variables]

  @tf.function
  def round_fn():
    deltas = [tf.zeros_like(v) for v in start]
    for client_batches in batches:
      for var, value in zip(variables, start):
        var.assign(value)
      for x, y in client_batches:
        with tf.GradientTape() as tape:
          loss = loss_fn(y, model(x, training=True))
        for var, grad in zip(variables, tape.gradient(loss, variables)):
          var.assign_sub(lr * tf.convert_to_tensor(grad))
      deltas = [d + v - s for d, v, s in zip(deltas, variables, start)]
    return [s + d / len(batches) for s, d in zip(start, deltas)]

  return lambda: [t.numpy() for t in round_fn()]


def round_times(name: str, rounds: int, tmp: str) -> dict[str, list[float]]:
  """Seconds of `rounds` interleaved rounds of each backend and of the floor."""
  from tff_fedadamom.experiment import iter_experiment

  total = WARMUPS + rounds + 1  # the last round (evaluation, checkpoint) is never timed
  runs = {b: iter_experiment(config_dict(name, b, total, os.path.join(tmp, f"{name}-{b}")),
                             progress=False) for b in BACKENDS}
  try:
    calls = {backend: (lambda run=run: next(run)) for backend, run in runs.items()}
    calls["floor"] = floor_round(config_dict(name, "inprocess", total, tmp))
    return common.interleaved(calls, rounds, warmups=WARMUPS)
  finally:
    for run in runs.values():
      run.close()  # ends the run where it stands: its backend is closed


def memory(rounds: int, tmp: str) -> str:
  """The memory line: RSS (MB) and TensorFlow functions after round MEMORY_MARK and at the end."""
  from tensorflow.python.eager import context

  from tff_fedadamom.experiment import run_experiment

  marks = {}

  def on_round(round_num, metrics):
    del metrics
    if round_num in (MEMORY_MARK, rounds):
      with open("/proc/self/statm") as f:  # this process's resident memory (Linux)
        rss_mb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
      marks[round_num] = (rss_mb, len(context.context().list_function_names()))

  run_experiment({
      "seed": 0, "rounds": rounds, "clients_per_round": 5, "eval_every": 20,
      "checkpoint_every": 50, "output_dir": os.path.join(tmp, "memory"), "telemetry": True,
      "data": {"name": "digits", "num_clients": 20}, "model": {"name": "logistic"},
      "client": {"learning_rate": 0.1, "batch_size": 20},
      "server": {"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.05},
  }, on_round=on_round, progress=False)
  (start, functions_start), (end, functions_end) = marks[MEMORY_MARK], marks[rounds]
  per_1000 = (end - start) * 1000 / (rounds - MEMORY_MARK)
  return (f"Memory, digits/logistic with telemetry, in-process, {rounds} rounds: RSS "
          f"{start:.1f} MB after round {MEMORY_MARK}, {end:.1f} MB after round {rounds}: "
          f"{end - start:+.1f} MB, {per_1000:+.1f} MB per 1,000 rounds (goal < "
          f"{MEMORY_GOAL_MB:g} MB: {common.goal(per_1000, MEMORY_GOAL_MB, False)}); "
          f"TensorFlow functions {functions_start} then {functions_end}.")


def round_table(times: dict) -> str:
  """Median ms per round and backend / floor, a row per config (of CONFIGS)."""
  rows = []
  for name in CONFIGS:
    t = times.get(name)
    ms = lambda key: common.fmt(statistics.median(t[key]) * 1e3 if t else None, ".1f")
    over = lambda a, b: common.fmt(common.paired_ratio(t[a], t[b]) if t else None)
    rows.append([name, ms("floor")] + [ms(b) for b in BACKENDS]
                + [over(b, "floor") for b in BACKENDS] + [over(b, "inprocess") for b in ASYNC])
  return markdown_table(["config", "floor ms"] + [f"{b} ms" for b in BACKENDS]
                        + [f"{b} / floor" for b in BACKENDS]
                        + [f"{b} / inprocess" for b in ASYNC], rows)


def main(argv=None) -> int:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow starts
  from tff_fedadamom.session import Session

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", default=",".join(CONFIGS),
                      help=f"comma-separated, of {', '.join(CONFIGS)}")
  parser.add_argument("--rounds", type=int, default=8, help="timed rounds per backend")
  parser.add_argument("--memory-rounds", type=int, default=1000,
                      help=f"rounds of the memory run (> {MEMORY_MARK}; 0: skip it)")
  parser.add_argument("--results", default=common.RESULTS, help="the results file to update")
  args = parser.parse_args(argv)
  names = args.configs.split(",")
  unknown = [n for n in names if n not in CONFIGS]
  if unknown:
    parser.error(f"--configs: unknown {', '.join(unknown)}; allowed: {', '.join(CONFIGS)}")
  if args.rounds < 1:
    parser.error(f"--rounds must be >= 1, found {args.rounds}")
  if args.memory_rounds and args.memory_rounds <= MEMORY_MARK:
    parser.error(f"--memory-rounds must be 0 or > {MEMORY_MARK}, found {args.memory_rounds}")
  Session().apply()  # this script is its process's entry point, as the CLI is
  times = {}
  with tempfile.TemporaryDirectory() as tmp:
    # First, so that the process holds no other run's memory yet.
    mem = (memory(args.memory_rounds, tmp) if args.memory_rounds
           else f"Memory: {common.NOT_MEASURED}.")
    for name in names:
      times[name] = round_times(name, args.rounds, tmp)
      print(f"{name}: " + ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms"
                                    for k, v in times[name].items()), flush=True)
  body = (f"Median ms per round over {args.rounds} interleaved rounds after {WARMUPS} "
          "warm-up rounds; backend / floor is the median of the per-round ratios. ray: "
          "2 actors x 1 CPU x 1 thread. async0, async: asynchronous server steps of "
          "clients_per_round updates, in-process; async0 without delay, async with twice "
          "as many clients in flight and lognormal(1) speeds (stale updates). The floor: "
          "the same SGD steps over the same batches and the mean of the deltas, in one "
          "`tf.function`.\n\n"
          + round_table(times) + "\n" + mem)
  print(common.write_section("rounds", "Rounds: each backend against the floor", body,
                             args.results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
