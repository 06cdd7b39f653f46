"""Ray backend scaling: rounds per second with 1 actor vs 2 actors, in one run.

A compute-bound round: ResNet-18 (GroupNorm) on CIFAR-10-format fixture data
(files written in the real on-disk format, synthetic pixels), `--clients`
clients per round, every client every round. Each Ray configuration gives each
actor 1 CPU and 1 TensorFlow thread; the in-process backend (this process, all
its threads) is measured for reference. Prints seconds per round (median over
the timed rounds, after one warm-up round), the 2-vs-1-actor speed-up (goal:
>= 1.7x on a 2-core machine), and where a Ray round's time goes: broadcast
(`prepare` + putting it into the object store), the actors' work (until the
last actor's `work` is done), merge = fold (the accumulator's fold across the
actors, until it reaches the driver) + server (`report` and `update` on the
driver). Each actor runs one client at a time (the default for an actor of one
CPU), so "1 actor x 1 thread" keeps one core busy.

    .venv/bin/python benchmarks/ray_clients.py [--rounds 3] [--clients 10] [--images 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Ray starts its workers at niceness 15 (the driver keeps 0): on a machine with
# other work the actors, not the scaling mechanism, would then be what is
# measured. The benchmark's own Ray runs them at the driver's priority.
os.environ.setdefault("RAY_worker_niceness", "0")

from tests.data.fixtures import write_cifar10  # noqa: E402
from tff_fedadamom.config import load_config  # noqa: E402
from tff_fedadamom.data.sampling import sample_clients  # noqa: E402
from tff_fedadamom.pipeline import backends, build_process  # noqa: E402
from tff_fedadamom.pipeline.parts import make_plan  # noqa: E402
from tff_fedadamom.pipeline.plan import training_loop  # noqa: E402
from tff_fedadamom.pipeline.process import load_data, make_client_tensors  # noqa: E402


def _config(args, data_dir, output_dir, runtime_section):
  return load_config({
      "seed": 0, "rounds": args.rounds + 1, "clients_per_round": args.clients,
      "output_dir": output_dir,
      "data": {"name": "cifar10", "path": data_dir, "num_clients": args.clients,
               "partition": {"kind": "iid"}},
      "model": {"name": "resnet18"},
      "client": {"learning_rate": 0.05, "batch_size": args.batch_size, "local_epochs": 1},
      "server": {"optimizer": "fedavg", "learning_rate": 1.0},
      "runtime": runtime_section,
  })


def _measure(config, data, backend, rounds):
  """Seconds of each round after a warm-up one, and the Ray rounds' breakdowns."""
  state = backend.initialize()
  ids = list(data.train.client_ids)
  seconds, parts = [], []
  for round_num in range(1, rounds + 2):
    sampled = sample_clients(ids, config.clients_per_round, config.seed, round_num)
    t0 = time.perf_counter()
    state = backend.next_for_clients(state, sampled, round_num).state
    if round_num > 1:
      seconds.append(time.perf_counter() - t0)
      parts.append(getattr(backend, "round_times", {}))
  return seconds, parts


def main(argv=None):
  from tff_fedadamom.session import Session

  Session().apply()  # this command is its process's entry point
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration")
  parser.add_argument("--clients", type=int, default=10)
  parser.add_argument("--images", type=int, default=20, help="training images per client")
  parser.add_argument("--batch-size", type=int, default=10)
  args = parser.parse_args(argv)
  setups = [("inprocess", {"backend": "inprocess"}),
            ("ray 1 actor x 1 thread",
             {"backend": "ray", "workers": 1, "cpus_per_worker": 1, "threads": 1}),
            ("ray 2 actors x 1 thread",
             {"backend": "ray", "workers": 2, "cpus_per_worker": 1, "threads": 1})]
  medians = {}
  with tempfile.TemporaryDirectory() as tmp:
    # 5 training batches of the CIFAR-10 python format hold the images.
    data_dir = write_cifar10(tmp, per_batch=-(-args.clients * args.images // 5))
    for name, section in setups:
      config = _config(args, data_dir, os.path.join(tmp, "run"), section)
      data = load_data(config)
      plan = make_plan(config)
      backend = backends.build_backend(
          plan, build_process(config, data, training_loop(plan.devices)),
          make_client_tensors(config, data))
      try:
        seconds, parts = _measure(config, data, backend, args.rounds)
      finally:
        backend.close()
      medians[name] = statistics.median(seconds)
      line = f"{name:26s} {medians[name]:7.2f} s/round  {1 / medians[name]:6.3f} rounds/s"
      if parts[0]:
        line += "  (" + ", ".join(
            f"{key[:-2]} {statistics.median(p[key] for p in parts):.3f} s"
            for key in ("broadcast_s", "actors_s", "merge_s", "fold_s", "server_s")) + ")"
      print(line, flush=True)
  one, two = medians["ray 1 actor x 1 thread"], medians["ray 2 actors x 1 thread"]
  print(f"speed-up 1 -> 2 actors: {one / two:.2f}x (goal >= 1.7x); "
        f"2 actors vs in-process: {medians['inprocess'] / two:.2f}x")


if __name__ == "__main__":
  main()
