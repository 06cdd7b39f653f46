"""Fault figures for one run of the pipeline on tiny real data (digits, logistic model).

Prints:
- kill -9 at random rounds: kills survived / tried, identical finishes / tried
  (final weights bit-identical to an uninterrupted run with the same seed);
- hostile configs: configs tried / crashes other than the project's ConfigError (goal 0);
- SIGINT and SIGTERM mid-round: child processes left running (goal 0).

    .venv/bin/python benchmarks/faults.py [--kills 5] [--configs 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from tests import process_table as processes  # noqa: E402
from tff_fedadamom.config import ConfigError, load_config  # noqa: E402
from tff_fedadamom.pipeline import outputs, run_experiment  # noqa: E402

ROUNDS = 8


def _config(output_dir):
  return {
      "seed": 5, "rounds": ROUNDS, "clients_per_round": 3, "eval_every": 4,
      "checkpoint_every": 1, "output_dir": output_dir,
      "data": {"name": "digits", "num_clients": 8},
      "model": {"name": "logistic"},
      "client": {"learning_rate": 0.1, "batch_size": 16},
      "server": {"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.1},
  }


def _weights(output_dir):
  import tensorflow as tf

  model = tf.keras.models.load_model(os.path.join(output_dir, outputs.MODEL_FILE))
  return [w.numpy() for w in model.weights]


def _launch(config_path):
  env = {**os.environ, "PYTHONPATH": ROOT}
  return subprocess.Popen([sys.executable, "-m", "tff_fedadamom", "run", config_path,
                           "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env=env, start_new_session=True)


def _wait_rows(proc, output_dir, n, timeout=300):
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    try:
      if len(outputs.read_metrics(output_dir)) >= n:
        return True
    except Exception:  # noqa: BLE001 - mid-write
      pass
    time.sleep(0.02)
  return False


def kills(n, rng, tmp):
  reference = run_experiment(_config(os.path.join(tmp, "ref")), progress=False)
  ref_weights = _weights(reference.output_dir)
  survived = identical = 0
  for i in range(n):
    out = os.path.join(tmp, f"kill{i}")
    path = os.path.join(tmp, f"kill{i}.yaml")
    with open(path, "w") as f:
      yaml.safe_dump(_config(out), f)
    at = rng.randint(1, ROUNDS - 1)
    proc = _launch(path)
    _wait_rows(proc, out, at)
    time.sleep(rng.random() * 0.5)  # land anywhere inside the next round
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    result = subprocess.run([sys.executable, "-m", "tff_fedadamom", "run", path, "--quiet"],
                            capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    if result.returncode == 0:
      survived += 1
      same = all(np.array_equal(a, b) for a, b in zip(_weights(out), ref_weights))
      identical += int(same)
    print(f"  kill {i + 1}: after round >= {at}: "
          f"{'resumed' if result.returncode == 0 else 'FAILED'}"
          f"{', identical' if result.returncode == 0 and same else ''}")
  return survived, identical


def _random_value(rng, depth=0):
  pool = [None, True, False, 0, -1, 1, 3, 10**40, -(10**40), 0.5, -0.5, float("nan"),
          float("inf"), -float("inf"), 1e-300, "", "x", "digits", "fedadamom", "cnn",
          "dirichlet", "!!python/object", "1e999", [], {}]
  if depth < 2 and rng.random() < 0.3:
    if rng.random() < 0.5:
      return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(FIELDS): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
  return rng.choice(pool)


FIELDS = ["rounds", "seed", "clients_per_round", "data", "model", "client", "server",
          "runtime", "name", "path", "num_clients", "partition", "options", "kind", "alpha",
          "learning_rate", "beta_2", "epsilon", "optimizer", "batch_size", "schedule",
          "targets", "unknown"]


def hostile_configs(n, rng, tmp):
  crashes = []
  for i in range(n):
    base = _config(os.path.join(tmp, "never"))
    kind = i % 3
    if kind == 0:  # a random tree
      raw = {rng.choice(FIELDS): _random_value(rng) for _ in range(rng.randint(0, 6))}
    elif kind == 1:  # one field of a valid config replaced
      raw = base
      section = rng.choice(["data", "model", "client", "server", None])
      target = raw[section] if section else raw
      target[rng.choice(FIELDS)] = _random_value(rng)
    else:  # YAML text with tags and garbage
      text = rng.choice(["!!python/object/apply:os.system ['true']",
                         "rounds: !!python/name:os.system", "{{{", "rounds: 1e999",
                         "data: [1, 2", "\x00\x01", "rounds: .nan", "- 1\n- 2"])
      raw = os.path.join(tmp, f"fuzz{i}.yaml")
      with open(raw, "w") as f:
        f.write(text)
    try:
      load_config(raw)
    except ConfigError:
      pass
    except Exception as e:  # noqa: BLE001 - the figure counts exactly these
      crashes.append(f"{type(e).__name__}: {e}"[:200])
  return crashes


def leftovers(tmp):
  left = 0
  for sig in (signal.SIGINT, signal.SIGTERM):
    out = os.path.join(tmp, f"sig{sig}")
    path = out + ".yaml"
    with open(path, "w") as f:
      yaml.safe_dump({**_config(out), "rounds": 500}, f)
    proc = _launch(path)
    _wait_rows(proc, out, 1)
    children = processes.descendants(proc.pid)
    os.kill(proc.pid, sig)
    proc.wait(timeout=120)
    time.sleep(1.0)
    left += len(processes.still_running(children))
  return left


def main(argv=None):
  from tff_fedadamom.session import Session

  Session().apply()  # this command is its process's entry point
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--kills", type=int, default=5)
  parser.add_argument("--configs", type=int, default=2000)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  rng = random.Random(args.seed)
  with tempfile.TemporaryDirectory() as tmp:
    survived, identical = kills(args.kills, rng, tmp)
    crashes = hostile_configs(args.configs, rng, tmp)
    left = leftovers(tmp)
  print(f"kill -9: survived {survived}/{args.kills}, identical finishes {identical}/{args.kills}")
  print(f"hostile configs: {args.configs} tried, {len(crashes)} crashes other than "
        f"ConfigError (goal 0)")
  for crash in crashes[:10]:
    print(f"  {crash}")
  print(f"SIGINT/SIGTERM mid-run: {left} child processes left (goal 0)")


if __name__ == "__main__":
  main()
