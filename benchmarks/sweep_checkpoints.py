"""Tune checkpoints at ASHA's rungs and the end, against one at every evaluation.

    python benchmarks/sweep_checkpoints.py [--trials 4] [--rounds 8] [--repeats 2]

A small ASHA sweep (FedAvg, digits, logistic regression, `--trials` x `--rounds`,
evaluated and saved every round, grace period 1, reduction factor 2, one trial at
a time so that ASHA stops the same trials every time), with a Tune checkpoint at
every evaluation (as before `tuning.sweep.checkpoint_rounds`) and at the rounds
it gives (ASHA's rungs and the last round; the trials' runs save their state at
the same rounds only), alternately, `--repeats` times each
after one warm-up sweep: wall time, Tune checkpoints registered, trial-rounds,
and the wall time saved per checkpoint not taken.

Every trial is real, through `tuning.run_sweep` on one local Ray started here
(127.0.0.1, no dashboard). Absolute times depend on the machine and its load;
the comparison is within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ray import tune  # noqa: E402

from benchmarks.sweep_scaling import digits_sweep, local_ray  # noqa: E402
from tff_fedadamom.metric_names import ROUND  # noqa: E402


class _CountCheckpoints(tune.Callback):
  """Appends a line to `path` for every checkpoint Tune registers (Tune
  pickles callbacks into the experiment: the count is kept in a file)."""

  def __init__(self, path: str):
    self.path = path

  def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
    with open(self.path, "a") as f:
      f.write(f"{trial.trial_id}\n")


def _tiny_asha_sweep(name: str, root: str, trials: int, rounds: int) -> dict:
  raw = digits_sweep(name, root, trials=trials, rounds=rounds, concurrent=1)
  raw["base"].update(model={"name": "logistic"}, clients_per_round=4,
                     data={"name": "digits", "num_clients": 10,
                           "partition": {"kind": "dirichlet", "alpha": 0.5}},
                     client={"learning_rate": 0.1, "batch_size": 20})
  raw["scheduler"] = {"kind": "asha", "grace_period": 1, "reduction_factor": 2}
  return raw


def checkpoints(root: str, trials: int, rounds: int, repeats: int) -> None:
  """See the module docstring. "Every evaluation" replaces
  `tuning.sweep.checkpoint_rounds` for its runs only (every round)."""
  from unittest import mock

  from tuning import run_sweep
  from tuning import sweep as sweep_lib

  print(f"Tune checkpoints: FedAvg, digits, logistic, {trials} trials x {rounds} rounds, "
        "evaluated and saved every round, ASHA grace 1 rf 2, 1 trial at a time", flush=True)
  every_round = lambda sweep: frozenset(range(1, sweep.budget.rounds + 1))  # noqa: E731
  with open(os.devnull, "w") as quiet:  # Ray's and the process cache's first use: not counted
    start = time.perf_counter()
    run_sweep(_tiny_asha_sweep("ckpt_warm", root, trials, rounds), progress_interval_s=3600,
              stream=quiet)
  print(f"  warm-up sweep (not counted): wall {time.perf_counter() - start:6.1f} s", flush=True)
  runs: dict[str, list] = {"every evaluation": [], "rungs and the end": []}
  for i in range(repeats):
    for label in runs:
      count = os.path.join(root, f"ckpt_{i}_{len(runs[label])}_{label[:5]}.count")
      open(count, "w").close()
      raw = _tiny_asha_sweep(f"ckpt_{i}_{label[:5]}", root, trials, rounds)
      patch = (mock.patch.object(sweep_lib, "checkpoint_rounds", every_round)
               if label == "every evaluation" else contextlib.nullcontext())
      load = os.getloadavg()[0]
      with patch, open(os.devnull, "w") as quiet:
        start = time.perf_counter()
        result = run_sweep(raw, progress_interval_s=3600, stream=quiet,
                           callbacks=[_CountCheckpoints(count)])
        wall = time.perf_counter() - start
      with open(count) as f:
        taken = len(f.read().splitlines())
      trial_rounds = sum(int(r.metrics.get(ROUND, 0)) for g in result.results.values()
                         for r in g)
      runs[label].append((wall, taken))
      print(f"  {label:<18} run {i + 1}: wall {wall:6.1f} s, {taken:3d} Tune checkpoints, "
            f"{trial_rounds} trial-rounds; load average {load:.2f} at its start", flush=True)
  (before, after) = ([sum(v) / len(v) for v in zip(*runs[k])] for k in runs)
  saved = before[1] - after[1]
  per = (before[0] - after[0]) / saved if saved else float("nan")
  print(f"  mean: every evaluation {before[0]:.1f} s / {before[1]:.0f} checkpoints, rungs and "
        f"the end {after[0]:.1f} s / {after[1]:.0f} checkpoints: {saved:.0f} fewer, "
        f"{before[0] - after[0]:+.1f} s ({per:.2f} s per checkpoint not taken)", flush=True)


def main(argv=None) -> int:
  from tff_fedadamom.session import Session

  Session().apply()  # this command is its process's entry point
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--trials", type=int, default=4)
  parser.add_argument("--rounds", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args(argv)
  root = tempfile.mkdtemp(prefix="sweep_checkpoints_")
  try:
    with local_ray():
      checkpoints(root, args.trials, args.rounds, args.repeats)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
