"""Does a long run's memory stay flat? RSS after round 100 and at the end.

Runs digits/logistic with telemetry on the in-process backend for `--rounds`
rounds (evaluation and checkpoints at their usual cadence) and prints the
process's resident memory after round 100 and after the last round, and the
growth per 1,000 rounds. Goal: less than 5 MB of growth after round 100 over
1,000 rounds.

    .venv/bin/python benchmarks/round_memory.py [--rounds 1000]
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tff_fedadamom.session import Session  # noqa: E402

Session().apply()  # this script is its process's entry point

from tff_fedadamom.pipeline import run_experiment  # noqa: E402


def rss_mb() -> float:
  """This process's resident memory, from /proc (Linux)."""
  with open("/proc/self/statm") as f:
    pages = int(f.read().split()[1])
  return pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=1000)
  parser.add_argument("--no-telemetry", action="store_true",
                      help="turn telemetry off, to see how much of the growth is its")
  args = parser.parse_args(argv)
  marks: dict[int, float] = {}

  def on_round(round_num, metrics):
    del metrics
    if round_num in (100, args.rounds):
      marks[round_num] = rss_mb()

  with tempfile.TemporaryDirectory() as tmp:
    run_experiment({
        "seed": 0, "rounds": args.rounds, "clients_per_round": 5, "eval_every": 20,
        "checkpoint_every": 50, "output_dir": tmp, "telemetry": not args.no_telemetry,
        "data": {"name": "digits", "num_clients": 20},
        "model": {"name": "logistic"},
        "client": {"learning_rate": 0.1, "batch_size": 20},
        "server": {"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.05},
    }, on_round=on_round, progress=False)
  growth = marks[args.rounds] - marks[100]
  per_1000 = growth * 1000 / max(args.rounds - 100, 1)
  print(f"RSS after round 100: {marks[100]:.1f} MB; after round {args.rounds}: "
        f"{marks[args.rounds]:.1f} MB; growth {growth:.1f} MB ({per_1000:.1f} MB per 1,000 "
        f"rounds; goal < 5: {'met' if per_1000 < 5 else 'NOT met'})")


if __name__ == "__main__":
  main()
