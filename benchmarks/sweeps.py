"""The sweep benchmark: a sweep through Ray Tune against its trials as separate runs.

    python -m benchmarks.sweeps [--only quickstart|fmnist] [--out DIR]

Every figure is the wall time of whole commands as a user types them, each in a
fresh storage directory, with this run's own process cache
(`TFF_FEDADAMOM_CACHE_DIR` and `runtime.cache_dir`). Each sweep runs twice with
`python -m tff_fedadamom tune SWEEP --set KEY=VALUE ...`: cold (every learning process traced and
compiled) and warm (on the cache the cold sweep filled); the quickstart sweep's
trials then run as separate `python -m tff_fedadamom run` commands, as many at a
time as the sweep runs trials: separate / warm is what the sweep saves over a
shell loop.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Optional, Sequence

from benchmarks import common
from benchmarks.common import NOT_MEASURED, fmt, goal, ratio

GOAL = 2.5
QUICKSTART = "configs/sweeps/quickstart.yaml"
FMNIST = "configs/sweeps/fmnist_all_optimizers.yaml"
LABELS = ("cold", "warm")
# Dotted path -> value: the fmnist sweep at a size one machine runs in minutes.
FMNIST_SHORT = {
    "budget.trials_per_optimizer": 2, "budget.rounds": 10, "base.eval_every": 5,
    "base.checkpoint_every": 5, "base.clients_per_round": 5, "base.client.max_examples": 100,
    "scheduler.grace_period": 5, "scheduler.reduction_factor": 2,
    "resources.cpus_per_trial": 1, "resources.max_concurrent_trials": 2, "metric.last_k": 1,
}
# Name -> (sweep file, the dotted values it runs with).
SWEEPS = {"quickstart": (QUICKSTART, {}), "fmnist": (FMNIST, FMNIST_SHORT)}


def prepare(sweep_file: str, values: Mapping, scratch: str, separate: bool) -> dict:
  """The `--set` overrides that give sweep `sweep_file` the dotted `values`, checked by
  loading the sweep with them; with `separate`, each trial's experiment config written
  to `runs/` of `scratch`."""
  from tff_fedadamom.config import dump_config, load_config
  from tuning import joint, schema, space

  overrides = [f"{path}={json.dumps(value)}" for path, value in values.items()]
  sweep = schema.load_sweep(sweep_file, overrides)
  runs_dir, runs = os.path.join(scratch, "runs"), []
  if separate:
    os.makedirs(runs_dir, exist_ok=True)
  for i, trial in enumerate(joint.trial_configs(sweep) if separate else ()):
    params = dict(trial)
    optimizer = params.pop("optimizer")
    name = f"{optimizer}_{i}"
    config = space.experiment_dict(sweep, optimizer, params, threads=1, name=name,
                                   output_dir=os.path.join(runs_dir, name))
    runs.append(os.path.join(runs_dir, f"{name}.yaml"))
    dump_config(load_config(config), runs[-1])
  return {"overrides": overrides, "runs": runs,
          "concurrent": sweep.resources.max_concurrent_trials,
          "trials": len(sweep.optimizers) * sweep.budget.trials_per_optimizer,
          "rounds": sweep.budget.rounds}


def run_commands(commands: Sequence[Sequence[str]], env: dict, logs: str,
                 concurrent: int) -> float:
  """Wall seconds of `commands`, `concurrent` at a time, each logged in `logs`;
  raises naming the first that failed and its log."""
  os.makedirs(logs, exist_ok=True)
  procs, paths = [], []
  start = time.perf_counter()
  try:
    for command in commands:
      while sum(p.poll() is None for p in procs) >= concurrent:
        time.sleep(0.05)
      paths.append(os.path.join(logs, f"{len(procs)}.log"))
      with open(paths[-1], "w") as log:
        procs.append(subprocess.Popen(command, cwd=common.ROOT, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    codes = [p.wait() for p in procs]
  finally:  # ends the process groups still running (each command started its own)
    for proc in procs:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  wall = time.perf_counter() - start
  for command, code, path in zip(commands, codes, paths):
    if code != 0:
      with open(path) as f:
        tail = "".join(f.readlines()[-15:])
      raise RuntimeError(f"{' '.join(command)} exited {code}; log {path}:\n{tail}")
  return wall


def measure(name: str, scratch: str) -> dict:
  """Cold and warm sweep seconds of sweep `name` (of SWEEPS) in a new directory
  `scratch`; for quickstart, also the seconds of its trials as separate runs."""
  (sweep_file, values), separate = SWEEPS[name], name == "quickstart"
  os.makedirs(scratch)
  cache = os.path.join(scratch, "process-cache")
  # Every command's environment: this checkout's code first, this run's cache.
  env = {**os.environ, "PYTHONPATH": common.ROOT, "TFF_FEDADAMOM_CACHE_DIR": cache,
         "TF_CPP_MIN_LOG_LEVEL": "3"}
  info = prepare(os.path.join(common.ROOT, sweep_file),
                 {**values, "base.runtime.cache_dir": cache}, scratch, separate)
  figures = {k: info[k] for k in ("trials", "rounds", "concurrent")}
  for label in LABELS:
    storage = json.dumps(os.path.join(scratch, label))  # a YAML value, as `prepare`'s
    overrides = info["overrides"] + [f"resources.storage_path={storage}"]
    tune = [sys.executable, "-m", "tff_fedadamom", "tune", sweep_file,
            *(arg for o in overrides for arg in ("--set", o))]
    figures[label] = run_commands([tune], env, os.path.join(scratch, f"logs-{label}"), 1)
    print(f"  {sweep_file}: {label} sweep {figures[label]:.1f} s", flush=True)
  if separate:
    figures["separate"] = run_commands(
        [[sys.executable, "-m", "tff_fedadamom", "run", p, "--quiet"] for p in info["runs"]],
        env, os.path.join(scratch, "logs-runs"), info["concurrent"])
    print(f"  {sweep_file}: {len(info['runs'])} separate runs, {info['concurrent']} at a "
          f"time, {figures['separate']:.1f} s", flush=True)
  return figures


def section(results: Mapping[str, Optional[dict]]) -> str:
  """The Markdown body from `results`: name -> figures, or None for a sweep not run."""
  from tff_fedadamom.experiment.outputs import markdown_table

  rows = []
  for name, (sweep_file, values) in SWEEPS.items():
    label = f"`{sweep_file}` " + ("shortened" if values else "as shipped")
    m = results.get(name) or {}
    size = (f"{m['trials']} trials x {m['rounds']} rounds, {m['concurrent']} at a time"
            if m else NOT_MEASURED)
    speedup = ratio(m.get("separate"), m.get("warm"))
    rows.append([label, size, fmt(m.get("cold"), ".1f"), fmt(m.get("warm"), ".1f"),
                 fmt(m.get("separate"), ".1f"), fmt(ratio(m.get("cold"), m.get("warm"))),
                 f"{fmt(speedup)} ({goal(speedup, GOAL)})" if m.get("separate") else
                 NOT_MEASURED])
  shortened = ", ".join(f"{k} {v}" for k, v in FMNIST_SHORT.items())
  return ("Commands: `python -m tff_fedadamom tune` (cold: empty process "
          "cache; warm: the cache the cold sweep filled) and the same trials as separate "
          "`python -m tff_fedadamom run` commands on the warm cache, wall seconds. Goal: "
          f"separate / warm sweep >= {GOAL:g}x. Shortened fmnist: {shortened}.\n\n"
          + markdown_table(["sweep", "trials", "cold sweep s", "warm sweep s",
                            "separate runs s", "cold / warm", "separate / warm sweep"], rows))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", choices=tuple(SWEEPS), default=None)
  parser.add_argument("--out", default=None, help="keep scratch files (logs, trial runs) here")
  parser.add_argument("--results", default=common.RESULTS, help="the results file to update")
  args = parser.parse_args(argv)
  if args.out:
    os.makedirs(args.out, exist_ok=True)
  scratch = tempfile.mkdtemp(prefix="sweeps-", dir=args.out)
  print(f"sweeps of {common.ROOT} ({common.commit()}), scratch {scratch}; load average "
        f"{os.getloadavg()[0]:.2f}", flush=True)
  results = {}
  try:
    for name in SWEEPS:
      if args.only in (None, name):
        results[name] = measure(name, os.path.join(scratch, name))
  finally:
    if not args.out:
      shutil.rmtree(scratch, ignore_errors=True)
  print(common.write_section("sweeps", "Sweeps: Ray Tune against separate runs",
                             section(results), args.results))
  return 0


if __name__ == "__main__":
  sys.exit(main())
