"""Faults: a run killed with SIGKILL resumes to the same numbers; a stopped run
leaves no process behind.

    python -m benchmarks.faults [--kills 5] [--seed 0]

Every run is a `python -m tff_fedadamom run` command on tiny real data (digits,
logistic regression, FedAdamom, a checkpoint every round). kill -9: `--kills`
times, the command is killed at a random point of a random round (after round
k's metrics row, k in 1..ROUNDS-1, plus up to 0.1 s), then runs again and
resumes from its checkpoints; its final weights must be those of one
uninterrupted run, bit for bit. SIGINT and SIGTERM mid-run, and kill -9: no
child process of the command may still run a second after it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import yaml

from benchmarks import common
from tff_fedadamom import process_table
from tff_fedadamom.experiment import outputs

ROUNDS = 8


def write_config(output_dir: str, rounds: int = ROUNDS) -> str:
  """The experiment's YAML file beside `output_dir`; returns its path."""
  path = output_dir + ".yaml"
  with open(path, "w") as f:
    yaml.safe_dump({
        "seed": 5, "rounds": rounds, "clients_per_round": 3, "eval_every": 4,
        "checkpoint_every": 1, "output_dir": output_dir,
        "data": {"name": "digits", "num_clients": 8}, "model": {"name": "logistic"},
        "client": {"learning_rate": 0.1, "batch_size": 16},
        "server": {"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.1},
    }, f)
  return path


def launch(config_path: str) -> subprocess.Popen:
  """`python -m tff_fedadamom run <config_path> --quiet`, in a session of its own."""
  return subprocess.Popen([sys.executable, "-m", "tff_fedadamom", "run", config_path, "--quiet"],
                          cwd=common.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True, env={**os.environ, "PYTHONPATH": common.ROOT})


def rows(output_dir: str) -> int:
  """The metrics rows the run has written so far."""
  try:
    return len(outputs.read_metrics(output_dir))
  except Exception:  # noqa: BLE001 - the file is missing or mid-write
    return 0


def wait_rows(proc: subprocess.Popen, output_dir: str, count: int, timeout: float = 300) -> None:
  """Until the run has written `count` metrics rows (or ended, or `timeout`)."""
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None and rows(output_dir) < count:
    time.sleep(0.02)


def final_weights(output_dir: str) -> list:
  import tensorflow as tf

  model = tf.keras.models.load_model(os.path.join(output_dir, outputs.MODEL_FILE))
  return [w.numpy() for w in model.weights]


def stop(proc: subprocess.Popen, sig: signal.Signals, children: list[int]) -> int:
  """Sends `sig` to the command; returns how many of its `children` still run a
  second after it exits, and ends those (they are this benchmark's)."""
  os.kill(proc.pid, sig)
  proc.wait(timeout=120)
  time.sleep(1.0)
  alive = process_table.still_running(children)
  for pid in alive:
    with contextlib.suppress(ProcessLookupError):
      os.kill(pid, signal.SIGKILL)
  return len(alive)


def kills(n: int, rng: random.Random, tmp: str) -> dict:
  """Counts of `n` kill -9s: before the run's end, resumed, identical, children left."""
  import numpy as np

  reference = os.path.join(tmp, "reference")
  if launch(write_config(reference)).wait() != 0:
    raise RuntimeError("faults: the uninterrupted reference run failed")
  expected = final_weights(reference)
  counts = {"mid_run": 0, "resumed": 0, "identical": 0, "left": 0}
  for i in range(n):
    out = os.path.join(tmp, f"kill{i}")
    path = write_config(out)
    at = rng.randint(1, ROUNDS - 1)
    proc = launch(path)
    wait_rows(proc, out, at)
    time.sleep(rng.random() * 0.1)  # anywhere inside the next round or two
    children = process_table.descendants(proc.pid)
    counts["mid_run"] += proc.poll() is None and rows(out) < ROUNDS
    counts["left"] += stop(proc, signal.SIGKILL, children)
    resumed = launch(path).wait() == 0
    same = resumed and all(
        np.array_equal(a, b) for a, b in zip(final_weights(out), expected, strict=True))
    counts["resumed"] += resumed
    counts["identical"] += same
    print(f"  kill {i + 1}: after round >= {at}: "
          f"{'resumed' if resumed else 'FAILED'}{', identical' if same else ''}", flush=True)
  return counts


def leftovers(tmp: str) -> dict[str, int]:
  """Children still running a second after a run stopped by SIGINT or SIGTERM."""
  left = {}
  for sig in (signal.SIGINT, signal.SIGTERM):
    out = os.path.join(tmp, f"signal{int(sig)}")
    proc = launch(write_config(out, rounds=500))
    wait_rows(proc, out, 1)
    left[sig.name] = stop(proc, sig, process_table.descendants(proc.pid))
  return left


def section(n: int, counts: dict, left: dict) -> str:
  lines = [["kill -9 at a random round, then the same command again", n,
            f"killed before the run's end {counts['mid_run']}/{n}; resumed "
            f"{counts['resumed']}/{n}; final weights bit-identical to an "
            f"uninterrupted run {counts['identical']}/{n}; child processes left "
            f"{counts['left']} (goal 0)"]]
  lines += [[f"{name} mid-run", 1, f"child processes left {count} (goal 0)"]
            for name, count in left.items()]
  return ("`python -m tff_fedadamom run` on digits/logistic with FedAdamom, "
          f"{ROUNDS} rounds, a checkpoint every round.\n\n"
          + outputs.markdown_table(["fault", "tried", "outcome"], lines))


def main(argv=None) -> int:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # this process's and its commands'
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--kills", type=int, default=5)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--results", default=common.RESULTS, help="the results file to update")
  args = parser.parse_args(argv)
  if args.kills < 1:
    parser.error(f"--kills must be >= 1, found {args.kills}")
  with tempfile.TemporaryDirectory() as tmp:
    counts = kills(args.kills, random.Random(args.seed), tmp)
    left = leftovers(tmp)
  print(common.write_section("faults", "Faults: kill -9 and resume, signals",
                             section(args.kills, counts, left), args.results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
