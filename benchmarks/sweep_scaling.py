"""Sweep throughput and ASHA savings on this machine.

    python benchmarks/sweep_scaling.py [--trials 6] [--rounds 12] [--asha-trials 6]

1. Trials per hour with 1 and with 2 concurrent trials (1 CPU each, the same
   trials both times), and their ratio: on 2 cores the goal is >= 1.6.
2. The same random trials run to the end and under ASHA: the rounds (compute)
   ASHA saved, the wall time of each, and the best objective found each way.

Trials are real: FedAvg / FedAdamom on the digits data with a small MLP, through
`tuning.run_sweep` on one local Ray started here (127.0.0.1, no dashboard).
Wall times include each trial's process start, imports and TFF compilation,
which is what a sweep pays per trial.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _base(rounds: int) -> dict:
  return {
      "seed": 0, "rounds": rounds, "eval_every": 1, "checkpoint_every": 1,
      "targets": [0.5, 0.8], "telemetry": False, "clients_per_round": 5,
      "data": {"name": "digits", "num_clients": 20,
               "partition": {"kind": "dirichlet", "alpha": 0.5}},
      "model": {"name": "mlp"},
      "client": {"learning_rate": 0.1, "batch_size": 20, "local_epochs": 2},
      "server": {"optimizer": "fedavg"},
  }


def _sweep(name, root, *, optimizer, trials, rounds, concurrent, asha=None, seed=0):
  return {
      "name": name,
      "base": _base(rounds),
      "optimizers": [optimizer],
      "budget": {"trials_per_optimizer": trials, "rounds": rounds},
      "space": {"client.learning_rate": {"dist": "loguniform", "low": 0.01, "high": 1.0}},
      "search": {"kind": "random", "seed": seed},
      "scheduler": asha or {"kind": "none"},
      "metric": {"name": "test/accuracy", "last_k": 1, "mode": "max"},
      "resources": {"cpus_per_trial": 1, "max_concurrent_trials": concurrent,
                    "storage_path": root},
  }


def _run(raw):
  """(wall s, trials, rounds each trial ran, best objective of the trials that ran
  the whole budget (the ones an export would choose from), trial-seconds)."""
  from tuning import run_sweep

  with open(os.devnull, "w") as quiet:
    start = time.perf_counter()
    result = run_sweep(raw, progress_interval_s=3600, stream=quiet)
    wall = time.perf_counter() - start
  grid = next(iter(result.results.values()))
  rounds = [int(r.metrics.get("round", 0)) for r in grid]
  trial_seconds = sum(float(r.metrics.get("time_total_s", 0.0)) for r in grid)
  full = raw["budget"]["rounds"]
  best = max((r.metrics["objective"] for r in grid
              if not r.metrics.get("diverged") and int(r.metrics["round"]) == full),
             default=float("nan"))
  return wall, len(grid), rounds, best, trial_seconds


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--trials", type=int, default=6, help="trials per throughput run")
  parser.add_argument("--rounds", type=int, default=12)
  parser.add_argument("--asha-trials", type=int, default=6)
  parser.add_argument("--asha-rounds", type=int, default=12)
  parser.add_argument("--skip-asha", action="store_true")
  parser.add_argument("--skip-throughput", action="store_true")
  parser.add_argument("--keep", action="store_true", help="keep the sweep directories")
  args = parser.parse_args(argv)

  import ray

  from tff_fedadamom.pipeline import runtime

  runtime.install_worker_cleanup()
  root = tempfile.mkdtemp(prefix="sweep_scaling_")
  ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
           log_to_driver=False, configure_logging=False,
           runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}})
  try:
    print(f"machine: {os.cpu_count()} CPUs; trials: FedAvg, digits, MLP, "
          f"{args.rounds} rounds, 1 CPU per trial", flush=True)
    per_hour = {}
    for concurrent in (() if args.skip_throughput else (1, 2)):
      wall, n, _, _, _ = _run(_sweep(f"throughput_{concurrent}", root, optimizer="fedavg",
                                  trials=args.trials, rounds=args.rounds,
                                  concurrent=concurrent))
      per_hour[concurrent] = n / wall * 3600
      print(f"  {concurrent} concurrent: {n} trials in {wall:6.1f} s -> "
            f"{per_hour[concurrent]:7.1f} trials/hour", flush=True)
    if per_hour:
      ratio = per_hour[2] / per_hour[1]
      print(f"  speed-up 2 vs 1 concurrent: {ratio:.2f}x (goal >= 1.6) "
            f"{'OK' if ratio >= 1.6 else 'BELOW GOAL'}", flush=True)

    if not args.skip_asha:
      print(f"ASHA vs running every trial to the end: FedAdamom, {args.asha_trials} "
            f"trials x {args.asha_rounds} rounds, 2 concurrent", flush=True)
      full = _run(_sweep("full", root, optimizer="fedadamom", trials=args.asha_trials,
                         rounds=args.asha_rounds, concurrent=2))
      asha = _run(_sweep("asha", root, optimizer="fedadamom", trials=args.asha_trials,
                         rounds=args.asha_rounds, concurrent=2,
                         asha={"kind": "asha", "grace_period": 2,
                               "reduction_factor": 2}))
      for label, (wall, n, rounds, best, busy) in (("to the end", full), ("ASHA", asha)):
        print(f"  {label:<10}: {n} trials, {sum(rounds):4d} rounds run, {busy:6.1f} "
              f"trial-seconds, wall {wall:6.1f} s, best test/accuracy {best:.4f}",
              flush=True)
      print(f"  ASHA saved {1 - sum(asha[2]) / sum(full[2]):.0%} of the rounds, "
            f"{1 - asha[4] / full[4]:.0%} of the trial-seconds (each trial also pays "
            f"its start-up) and {1 - asha[0] / full[0]:.0%} of the wall time; best "
            f"objective {asha[3]:.4f} vs {full[3]:.4f} ({asha[3] - full[3]:+.4f})",
            flush=True)
  finally:
    ray.shutdown()
    if not args.keep:
      shutil.rmtree(root, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
