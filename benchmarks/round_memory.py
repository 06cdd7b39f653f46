"""Does a long run's memory stay flat? RSS after round 100 and at the end.

Runs digits/logistic with telemetry on the in-process backend for `--rounds`
rounds (evaluation and checkpoints at their usual cadence) and prints the
process's resident memory after round 100 and after the last round, the growth
in MB and per 1,000 rounds, how many objects a full garbage collection then
finds unreachable (garbage in reference cycles that the run held: Python frees
it only now and then, and its pages mostly stay with the process), and the
number of TensorFlow functions in the eager context at both marks (a function traced per
round would show there). Goal: less than 5 MB of growth between round 100 and
round 1,000.

With `--trace`, tracemalloc records the Python-side allocations from round 100
on and the growth is broken down by where it was allocated: the innermost frame
of this project and the allocating line. (tracemalloc's own bookkeeping inflates
RSS in that mode: read the RSS figures of a run without it.)

    .venv/bin/python benchmarks/round_memory.py [--rounds 1000] [--trace] [--no-telemetry]
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import tempfile
import tracemalloc

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tff_fedadamom.session import Session  # noqa: E402

Session().apply()  # this script is its process's entry point

from tff_fedadamom.pipeline import run_experiment  # noqa: E402

GOAL_MB = 5.0
MARK = 100


def rss_mb() -> float:
  """This process's resident memory, from /proc (Linux)."""
  with open("/proc/self/statm") as f:
    pages = int(f.read().split()[1])
  return pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def function_count() -> int:
  """Functions registered in TensorFlow's eager context."""
  from tensorflow.python.eager import context

  return len(context.context().list_function_names())


def _site(frame) -> str:
  return f"{frame.filename.split('site-packages/')[-1].split('tff_fedadamom/')[-1]}:{frame.lineno}"


def growth_by_site(before, after, top: int = 15) -> list[tuple[float, int, str, str]]:
  """(KiB, blocks, project frame, allocating line) of the largest growth from
  snapshot `before` to `after`, grouped by the innermost frame of this project."""
  size, count = collections.Counter(), collections.Counter()
  for stat in after.compare_to(before, "traceback"):
    frames = list(stat.traceback)  # oldest first
    own = [f for f in frames if "tff_fedadamom/" in f.filename]
    key = (_site(own[-1]) if own else "-", _site(frames[-1]))
    size[key] += stat.size_diff
    count[key] += stat.count_diff
  return [(kib / 1024, count[key], *key) for key, kib in size.most_common(top)]


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=1000)
  parser.add_argument("--no-telemetry", action="store_true",
                      help="turn telemetry off, to see how much of the growth is its")
  parser.add_argument("--trace", action="store_true",
                      help="break the Python-side growth down by allocation site")
  args = parser.parse_args(argv)
  marks: dict[int, tuple[float, int]] = {}
  snapshots = []
  collected = []

  def on_round(round_num, metrics):
    del metrics
    if round_num in (MARK, args.rounds):
      marks[round_num] = (rss_mb(), function_count())
      if round_num == args.rounds:
        collected.append(gc.collect())
      if args.trace:
        if round_num == MARK:
          tracemalloc.start(40)
        snapshots.append(tracemalloc.take_snapshot())

  with tempfile.TemporaryDirectory() as tmp:
    run_experiment({
        "seed": 0, "rounds": args.rounds, "clients_per_round": 5, "eval_every": 20,
        "checkpoint_every": 50, "output_dir": tmp, "telemetry": not args.no_telemetry,
        "data": {"name": "digits", "num_clients": 20},
        "model": {"name": "logistic"},
        "client": {"learning_rate": 0.1, "batch_size": 20},
        "server": {"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.05},
    }, on_round=on_round, progress=False)
  (start, functions_start), (end, functions_end) = marks[MARK], marks[args.rounds]
  growth = end - start
  print(f"RSS after round {MARK}: {start:.1f} MB; after round {args.rounds}: {end:.1f} MB; "
        f"growth {growth:.1f} MB ({growth * 1000 / max(args.rounds - MARK, 1):.1f} MB per "
        f"1,000 rounds); goal: < {GOAL_MB:g} MB from round {MARK} to 1,000: "
        f"{'met' if growth < GOAL_MB else 'NOT met'}")
  print(f"A full garbage collection after round {args.rounds} then found {collected[0]} "
        "unreachable objects")
  print(f"TensorFlow functions in the eager context: {functions_start} after round {MARK}, "
        f"{functions_end} after round {args.rounds}")
  if args.trace:
    total = sum(s.size_diff for s in snapshots[1].compare_to(snapshots[0], "filename"))
    print(f"Python-side growth (tracemalloc): {total / 2 ** 20:.2f} MB; largest, by the "
          "project's innermost frame and the allocating line:")
    for kib, blocks, own, line in growth_by_site(*snapshots):
      print(f"  {kib:8.1f} KiB {blocks:7d} blocks  {own:40s} {line}")


if __name__ == "__main__":
  main()
