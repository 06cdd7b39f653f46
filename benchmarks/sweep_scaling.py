"""Sweep throughput, overhead, concurrency scaling and ASHA savings on this machine.

    python benchmarks/sweep_scaling.py [--skip-cache] [--skip-quickstart] [--skip-scaling]
        [--skip-asha] [--fmnist-trials 4] [--fmnist-rounds 20] [--fmnist-optimizers fedadamom]

0. The process cache (`tff_fedadamom.pipeline.process_cache`): the quickstart
   sweep's wall time with a cold cache and again with the warm one (both in
   workers of their own, as `tff-fedadamom tune` runs it), then in a new shared
   pool (`tuning.shared_worker_pool`, whose node's template starts with it), and
   a fourth time in the trial workers the third left (as a caller running sweep
   after sweep in one Ray session keeps them), each with
   when Tune started its first trial, its first report and its export (timed
   apart: `run_sweep(..., export=False)`, then `export_sweep`); the same
   20 trials (each optimizer's two sampled configs, all rounds) as separate
   `tff-fedadamom run` commands, two at a time, on the warm cache; the ratios
   (the sweep's speed-up over a shell loop); the same sweep as a
   `tff-fedadamom tune` command on the warm cache (the sweeps above run in
   this process, whose imports, config checks and Ray are already done); Ray
   Tune's own part of the warm sweep, its reports replayed with no work
   (`benchmarks/tune_floor.py`), and so the highest speed-up any sweep of these
   trials through Tune could show; the floor of any sweep that starts its
   workers (the warm-worker sweep again, beside two new processes that import
   what a new worker does, Ray, TensorFlow and TFF; then Ray and TensorFlow
   only; then beside one process of each kind: `_importing`); and
   the time from starting `tff-fedadamom run configs/quickstart.yaml` to its first round's
   start and to its end (its first row of metrics), with a cold and with a
   warm cache.

1. `configs/sweeps/quickstart.yaml` (20 trials x 6 rounds, 2 at a time), the
   same trials three ways, one after the other in this run: the "before" (a
   Tuner per optimizer, every trial in a process of its own:
   `one_experiment=False, reuse_workers=False`), long-lived workers with a
   Tuner per optimizer, and the default (long-lived workers, one Tune
   experiment for all optimizers). For each: trials per hour, and the overhead
   share, 1 - (sum of the trials' round time) / (their wall time), with a
   trial's wall time counted two ways: Tune's `time_total_s` (what the trial's
   process measured, from its start) and its share of the sweep's slots
   (sweep wall time x concurrent trials / trials). Goals: overhead <= 20% and
   >= 3x the trials per hour of the "before" with the default.
2. Trials per hour with 1 and with 2 concurrent trials (1 CPU each, the same
   FedAvg / digits / MLP trials both times, workers reused), and their ratio:
   on 2 cores the goal is >= 1.6.
3. ASHA on `configs/sweeps/fmnist_all_optimizers.yaml` at a reduced budget
   (the flags above; grace period = one evaluation), against the same sweep
   with every trial run to the end: trial-rounds and trial-seconds saved, and
   whether the best objectives agree within 0.5 points. Goal: >= 50% of the
   trial-seconds saved.
4. Tune checkpoints at ASHA's rungs and the end against every evaluation:
   `benchmarks/sweep_checkpoints.py`.

Every trial is real, through `tuning.run_sweep` on one local Ray started here
(127.0.0.1, no dashboard). Absolute times depend on the machine and its load;
the ratios are measured within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import shutil
import sys
import tempfile
import time
from typing import Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import tune_floor  # noqa: E402 - after the path
from tff_fedadamom.metric_names import ELAPSED_S, ROUND, TEST_ACCURACY  # noqa: E402 - after the path


def _sweep_file(name: str) -> dict:
  from tuning import schema

  return schema.sweep_to_dict(schema.load_sweep(
      os.path.join(ROOT, "configs", "sweeps", f"{name}.yaml")))


def digits_sweep(name, root, *, trials, rounds, concurrent, seed=0):
  return {
      "name": name,
      "base": {
          "seed": 0, "rounds": rounds, "eval_every": 1, "checkpoint_every": 1,
          "targets": [0.5, 0.8], "telemetry": False, "clients_per_round": 5,
          "data": {"name": "digits", "num_clients": 20,
                   "partition": {"kind": "dirichlet", "alpha": 0.5}},
          "model": {"name": "mlp"},
          "client": {"learning_rate": 0.1, "batch_size": 20, "local_epochs": 2},
          "server": {"optimizer": "fedavg"},
      },
      "optimizers": ["fedavg"],
      "budget": {"trials_per_optimizer": trials, "rounds": rounds},
      "space": {"client.learning_rate": {"dist": "loguniform", "low": 0.01, "high": 1.0}},
      "search": {"kind": "random", "seed": seed},
      "scheduler": {"kind": "none"},
      "metric": {"name": TEST_ACCURACY, "last_k": 1, "mode": "max"},
      "resources": {"cpus_per_trial": 1, "max_concurrent_trials": concurrent,
                    "storage_path": root},
  }


@contextlib.contextmanager
def local_ray():
  """One local Ray for a whole benchmark run, started as `tff-fedadamom tune` starts
  one (`tuning.sweep_session`: this process forked into its node's template
  first, then `ray_session`: 127.0.0.1, no dashboard, no job runtime
  environment), told the machine has 2 CPUs."""
  from tuning.template import sweep_session

  with sweep_session(None, {"num_cpus": 2}):
    yield


def _first_trial_start():
  """A Tune callback whose `at` becomes the time (`time.time()`) Tune starts its
  first trial."""
  from ray import tune

  class FirstTrialStart(tune.Callback):
    at = None

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
      if self.at is None:
        self.at = time.time()

  return FirstTrialStart()


class _Run:
  """One sweep's measurements."""

  def __init__(self, raw, reuse: bool = True, one_experiment: bool = True, pool=None):
    from tuning import export_sweep, run_sweep

    first_start = _first_trial_start()
    with open(os.devnull, "w") as quiet:
      start, started_at = time.perf_counter(), time.time()
      result = run_sweep(raw, progress_interval_s=3600, stream=quiet, reuse_workers=reuse,
                         one_experiment=one_experiment, pool=pool, callbacks=[first_start],
                         export=False)
      exporting = time.perf_counter()
      export_sweep(result.sweep_dir)  # what run_sweep does last, timed apart
      self.wall = time.perf_counter() - start
    self.export_s = start + self.wall - exporting
    # Seconds from the call to Tune starting a first trial: the sweep's set-up
    # and Tune's own start, on CPUs the trial workers' imports share.
    self.first_start_s = (first_start.at or float("nan")) - started_at
    trials = [r for grid in result.results.values() for r in grid]
    self.results = trials
    # Seconds from the call to the first report of any trial (after its first
    # round): Tune's start, the trial workers' start and warm-up, the first
    # trial's set-up and round. Tune stamps reports in whole seconds.
    firsts = [float(r.metrics_dataframe["timestamp"].min()) for r in trials
              if r.metrics_dataframe is not None and len(r.metrics_dataframe)]
    self.first_report_s = min(firsts) - started_at if firsts else float("nan")
    self.trials = len(trials)
    self.rounds = sum(int(r.metrics.get(ROUND, 0)) for r in trials)
    totals = [float(r.metrics.get("time_total_s", 0.0)) for r in trials]
    rounds = [float(r.metrics.get(ELAPSED_S, 0.0)) for r in trials]
    self.trial_seconds, self.round_seconds = sum(totals), sum(rounds)
    # What a trial pays besides its rounds, median over the trials (so without
    # the few that waited for a worker to start).
    gaps = sorted(t - r for t, r in zip(totals, rounds))
    self.median_gap = gaps[len(gaps) // 2] if gaps else float("nan")
    self.errors = sum(r.error is not None for r in trials)
    full = raw["budget"]["rounds"]
    self.best = {}
    for optimizer, grid in result.results.items():
      self.best[optimizer] = max(
          (r.metrics["objective"] for r in grid
           if not r.metrics.get("diverged") and int(r.metrics[ROUND]) == full),
          default=float("nan"))

  def per_hour(self) -> float:
    return self.trials / self.wall * 3600

  def overhead(self, concurrent: int) -> tuple[float, float]:
    """(by Tune's time_total_s, by the sweep's slots)."""
    slots = self.wall * concurrent
    return 1 - self.round_seconds / self.trial_seconds, 1 - self.round_seconds / slots


def _first_round_s(config_path: str, output_dir: str, overrides: list) -> tuple[float, float]:
  """Seconds from starting `tff-fedadamom run` to its first round's start and to
  its end (its first metrics row), timed by `startup_timeline.py`'s child: the
  command's `main` as `entry` calls it, which exits once round 1's row is written."""
  import json
  import subprocess

  from benchmarks.startup_timeline import first_round

  timeline = output_dir + "-timeline.json"
  subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "startup_timeline.py"),
                  repr(time.time()), timeline, "run", config_path, "--quiet",
                  "--set", f"output_dir={output_dir}", *overrides],
                 cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                 env={**os.environ, "PYTHONPATH": ROOT})
  with open(timeline) as f:
    return first_round(json.load(f))


def _cli_loop(sweep, root: str, concurrent: int) -> tuple[int, float]:
  """The trials of `sweep` (a loaded `Sweep`: every optimizer's sampled configs,
  all rounds) as separate `tff-fedadamom run` commands, `concurrent` at a time:
  (runs, wall seconds)."""
  import subprocess

  import yaml

  from tuning import space as space_lib

  commands = []
  for optimizer in sweep.optimizers:
    for i, params in enumerate(space_lib.sample_trials(sweep, optimizer)):
      name = f"{optimizer}_{i}"
      path = os.path.join(root, "loop", f"{name}.yaml")
      os.makedirs(os.path.dirname(path), exist_ok=True)
      config = space_lib.experiment_dict(sweep, optimizer, params, threads=1, name=name,
                                         output_dir=os.path.join(root, "loop", name))
      with open(path, "w") as f:
        yaml.safe_dump(config, f)
      commands.append([sys.executable, "-m", "tff_fedadamom", "run", path, "--quiet"])
  start, procs = time.perf_counter(), []
  for command in commands:
    while sum(p.poll() is None for p in procs) >= concurrent:
      time.sleep(0.05)
    procs.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL))
  failed = sum(p.wait() != 0 for p in procs)
  if failed:
    print(f"  ({failed} of the runs failed)", flush=True)
  return len(commands), time.perf_counter() - start


def _cli_tune(raw: dict, root: str) -> float:
  """Wall seconds of the sweep `raw` as a `tff-fedadamom tune` command in a process
  of its own: besides what the sweeps run here in-process time, the command's
  imports, the checks of its experiments' configs, and its own Ray's start and stop."""
  import subprocess

  import yaml

  path = os.path.join(root, "command.yaml")  # beside the sweep's directory, not in it
  with open(path, "w") as f:
    yaml.safe_dump({**copy.deepcopy(raw), "name": "command"}, f)
  start = time.perf_counter()
  done = subprocess.run([sys.executable, "-m", "tff_fedadamom", "tune", path], cwd=ROOT,
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  wall = time.perf_counter() - start
  if done.returncode:
    raise RuntimeError(f"tff-fedadamom tune {path} failed ({done.returncode}): "
                       f"{done.stderr.strip().splitlines()[-3:]}")
  return wall


@contextlib.contextmanager
def _importing(modules: str, count: int = 2):
  """`count` new processes that import `modules` as a trial worker's template
  imports (sized as a worker is, `tuning.workers.worker_env`, and outside the
  garbage collector, `session.startup_imports`) while the block runs; yields a
  list that gets their wall seconds. Beside a sweep in warm workers, they cost
  what its new workers' imports would: a floor for any design whose workers
  start with the sweep and import at least `modules`, once per worker
  (`count` 2) or once for both (`count` 1, as forked workers do)."""
  import subprocess

  from tuning.workers import worker_env

  env = {**os.environ, **worker_env(1, ()), "PYTHONPATH": ROOT}
  code = ("import time\nt = time.perf_counter()\n"
          "from tff_fedadamom.session import startup_imports\n"
          f"with startup_imports():\n  import {modules}\n"
          "print(time.perf_counter() - t)")
  procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True) for _ in range(count)]
  seconds = []
  try:
    yield seconds
  finally:
    seconds.extend(float(p.communicate()[0] or "nan") for p in procs)


def process_cache(root: str) -> None:
  raw = _sweep_file("quickstart")
  raw["resources"]["storage_path"] = root
  cache_dir = os.path.join(root, "process-cache")
  raw["base"].setdefault("runtime", {})["cache_dir"] = cache_dir
  concurrent = raw["resources"]["max_concurrent_trials"]
  print("0. process cache: quickstart sweep, cold then warm; its trials as separate runs; "
        "time to a run's first round", flush=True)
  from tuning import schema, shared_worker_pool

  sweep = schema.load_sweep(raw)  # checked once, for the shell loop and Tune's floor

  sweeps = {}
  # The first two sweeps start workers of their own, as `tff-fedadamom tune`
  # does. The shared pool is made after them (it starts its node's template as it
  # is made): its first sweep forks new workers from that template, the next runs
  # in the workers it left. The last four: the floors of a sweep that starts its
  # two workers, with workers that import TensorFlow and TFF as ours do, and with
  # workers that would import no TFF at all; and the same for workers sharing one
  # import.
  rows = (("cold cache", False, None, 0), ("warm cache", False, None, 0),
          ("warm cache, a new shared pool", True, None, 0),
          ("warm cache and workers", True, None, 0),
          ("warm workers, 2 processes importing Ray, TF, TFF alongside", True,
           "ray, tensorflow, tensorflow_federated", 2),
          ("warm workers, 2 processes importing Ray, TF alongside", True, "ray, tensorflow", 2),
          ("warm workers, 1 process importing Ray, TF, TFF alongside", True,
           "ray, tensorflow, tensorflow_federated", 1),
          ("warm workers, 1 process importing Ray, TF alongside", True, "ray, tensorflow", 1))
  with contextlib.ExitStack() as stack:
    pool = None
    for label, shared, imports, count in rows:
      if shared and pool is None:
        pool = stack.enter_context(shared_worker_pool())
      kwargs = {"pool": pool} if shared else {}
      with _importing(imports, count) as imported:
        run = _Run({**copy.deepcopy(raw), "name": f"cache_{len(sweeps)}"}, **kwargs)
      sweeps[label] = run
      print(f"  sweep, {label}: {run.trials} trials ({run.errors} errored), "
            f"{run.rounds} trial-rounds in {run.wall:6.1f} s", flush=True)
      if imported:
        print("    the imports alongside took " + ", ".join(f"{s:.1f} s" for s in imported),
              flush=True)
      print(f"    where it went: Tune started a first trial after {run.first_start_s:5.1f} s "
            f"and had its first report after {run.first_report_s:5.1f} s (whole seconds: Tune's "
            f"stamps; the trial workers' start and warm-up, a first round); the export took "
            f"{run.export_s:4.1f} s; the trials' rounds "
            f"{run.round_seconds:5.1f} s and Tune's time_total_s {run.trial_seconds:5.1f} s "
            f"over {concurrent} slots of {run.wall:5.1f} s (median trial: "
            f"{run.median_gap:.2f} s besides its rounds)", flush=True)
  runs, loop_wall = _cli_loop(sweep, root, concurrent)
  print(f"  the same trials as {runs} separate runs ({raw['budget']['rounds']} rounds each), "
        f"{concurrent} at a time, warm cache: {loop_wall:6.1f} s", flush=True)
  print("  sweep speed-up over the shell loop: " + ", ".join(
      f"{loop_wall / run.wall:.2f}x ({label})" for label, run in sweeps.items()), flush=True)
  table = tune_floor.reports(sweeps["warm cache"].results)
  floor, made = tune_floor.replayed_sweep_s(sweep, table, os.path.join(root, "tune_floor"))
  print(f"  Tune alone (tune_floor.py), the warm sweep's {sum(map(len, table.values()))} "
        f"reports replayed with no work ({made} made): {floor:6.1f} s, so at most "
        f"{loop_wall / floor:.2f}x the shell loop's speed for any sweep of these trials "
        f"through Tune", flush=True)
  command = _cli_tune(raw, root)
  print(f"  the same sweep as a `tff-fedadamom tune` command, warm cache: {command:6.1f} s "
        f"({loop_wall / command:.2f}x the shell loop's speed)", flush=True)
  quick = os.path.join(ROOT, "configs", "quickstart.yaml")
  fresh = os.path.join(root, "first-round-cache")
  for label in ("cold", "warm"):
    start, end = _first_round_s(quick, os.path.join(root, f"first_{label}"),
                                ["--set", f"runtime.cache_dir={fresh}"])
    print(f"  tff-fedadamom run configs/quickstart.yaml, {label} cache: first round starts "
          f"{start:5.2f} s and ends {end:5.2f} s after launch", flush=True)


def quickstart(root: str) -> None:
  raw = _sweep_file("quickstart")
  raw["resources"]["storage_path"] = root
  concurrent = raw["resources"]["max_concurrent_trials"]
  print(f"1. quickstart sweep ({len(raw['optimizers'])} optimizers x "
        f"{raw['budget']['trials_per_optimizer']} trials x {raw['budget']['rounds']} "
        f"rounds, {concurrent} concurrent): the same trials three ways", flush=True)
  runs = {}
  for label, reuse, one in (("before: a Tuner per optimizer, a process per trial", False, False),
                            ("reused workers, a Tuner per optimizer", True, False),
                            ("reused workers, one experiment (default)", True, True)):
    run = _Run({**copy.deepcopy(raw), "name": f"quickstart_{len(runs)}"}, reuse=reuse,
               one_experiment=one)
    runs[label] = run
    by_trial, by_slot = run.overhead(concurrent)
    print(f"  {label}:\n    {run.trials} trials ({run.errors} errored) in {run.wall:6.1f} s "
          f"-> {run.per_hour():7.1f} trials/hour; rounds {run.round_seconds:6.1f} s of "
          f"{run.trial_seconds:6.1f} trial-seconds; overhead share {by_trial:.0%} "
          f"(per trial), {by_slot:.0%} (of the sweep's slots); median trial: "
          f"{run.median_gap:.2f} s besides its rounds", flush=True)
  before, after = list(runs.values())[0], list(runs.values())[-1]
  speedup = after.per_hour() / before.per_hour()
  by_trial, by_slot = after.overhead(concurrent)
  print(f"  trials/hour, default vs before: {speedup:.2f}x (goal >= 3) "
        f"{'OK' if speedup >= 3 else 'BELOW GOAL'}; overhead share of the default "
        f"{by_trial:.0%} per trial {'OK' if by_trial <= 0.2 else 'ABOVE GOAL'}, "
        f"{by_slot:.0%} of slots {'OK' if by_slot <= 0.2 else 'ABOVE GOAL'} "
        f"(goal <= 20%)", flush=True)


def scaling(root: str, trials: int, rounds: int) -> None:
  print(f"2. concurrency: FedAvg, digits, MLP, {trials} trials x {rounds} rounds, "
        "1 CPU per trial, reused workers", flush=True)
  per_hour = {}
  for concurrent in (1, 2):
    run = _Run(digits_sweep(f"scaling_{concurrent}", root, trials=trials, rounds=rounds,
                             concurrent=concurrent))
    per_hour[concurrent] = run.per_hour()
    print(f"  {concurrent} concurrent: {run.trials} trials in {run.wall:6.1f} s -> "
          f"{per_hour[concurrent]:7.1f} trials/hour", flush=True)
  ratio = per_hour[2] / per_hour[1]
  print(f"  speed-up 2 vs 1 concurrent: {ratio:.2f}x (goal >= 1.6) "
        f"{'OK' if ratio >= 1.6 else 'BELOW GOAL'}", flush=True)


# Where FedAvg trains without diverging on Fashion-MNIST (client and server
# learning rates around the quickstart's 0.05 and 1.0): for an ASHA comparison
# whose trials are stopped for being worse, not for having blown up.
STABLE_SPACE = {"client.learning_rate": {"dist": "loguniform", "low": 0.01, "high": 0.1},
                "server.learning_rate": {"dist": "loguniform", "low": 0.5, "high": 2.0}}


def asha(root: str, trials: int, rounds: int, optimizers: list[str],
         model: Optional[str] = None, stable: bool = False) -> None:
  raw = _sweep_file("fmnist_all_optimizers")
  eval_every = raw["base"]["eval_every"]
  raw["optimizers"] = optimizers
  if model is not None:
    raw["base"]["model"] = {"name": model}
  if stable:
    raw["space"] = dict(STABLE_SPACE)
  raw["budget"] = {"trials_per_optimizer": trials, "rounds": rounds}
  raw["scheduler"]["grace_period"] = eval_every
  raw["metric"]["last_k"] = min(raw["metric"]["last_k"], rounds // eval_every)
  raw["resources"]["storage_path"] = root
  print(f"3. ASHA on fmnist_all_optimizers at a reduced budget: {optimizers}, {trials} "
        f"trials x {rounds} rounds each (the file: {_sweep_file('fmnist_all_optimizers')['budget']}), "
        f"grace period {eval_every}, reduction factor {raw['scheduler']['reduction_factor']}, "
        f"objective: mean of the last {raw['metric']['last_k']} evaluations, "
        f"{raw['resources']['cpus_per_trial']} CPUs per trial, model "
        f"{raw['base']['model']['name']}, space {raw['space'] or 'the literature ranges'}",
        flush=True)
  full = _Run({**copy.deepcopy(raw), "name": "fmnist_full", "scheduler": {"kind": "none"}})
  early = _Run({**copy.deepcopy(raw), "name": "fmnist_asha"})
  for label, run in (("to the end", full), ("ASHA", early)):
    best = ", ".join(f"{o} {v:.4f}" for o, v in run.best.items())
    print(f"  {label:<10}: {run.trials} trials ({run.errors} errored), {run.rounds:4d} "
          f"trial-rounds, {run.trial_seconds:7.1f} trial-seconds, wall {run.wall:7.1f} s; "
          f"best objective: {best}", flush=True)
  seconds = 1 - early.trial_seconds / full.trial_seconds
  gaps = {o: early.best[o] - full.best[o] for o in optimizers}
  agree = all(abs(g) <= 0.005 for g in gaps.values())
  print(f"  ASHA saved {1 - early.rounds / full.rounds:.0%} of the trial-rounds, "
        f"{seconds:.0%} of the trial-seconds (goal >= 50%: "
        f"{'OK' if seconds >= 0.5 else 'BELOW GOAL'}) and "
        f"{1 - early.wall / full.wall:.0%} of the wall time; best objective ASHA - full: "
        + ", ".join(f"{o} {g * 100:+.2f} points" for o, g in gaps.items())
        + f" ({'agree' if agree else 'do not agree'} within 0.5 points)", flush=True)


def main(argv=None) -> int:
  from tff_fedadamom.session import Session

  Session().apply()  # this command is its process's entry point
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--skip-cache", action="store_true")
  parser.add_argument("--skip-quickstart", action="store_true")
  parser.add_argument("--skip-scaling", action="store_true")
  parser.add_argument("--skip-asha", action="store_true")
  # Enough trials that the sweep's one-off costs (Tune's start, the workers'
  # imports) do not hide how the trials themselves scale.
  parser.add_argument("--trials", type=int, default=24, help="trials per scaling run")
  parser.add_argument("--rounds", type=int, default=12, help="rounds per scaling trial")
  parser.add_argument("--fmnist-trials", type=int, default=4)
  parser.add_argument("--fmnist-rounds", type=int, default=20)
  parser.add_argument("--fmnist-optimizers", default="fedadamom",
                      help="comma-separated optimizers of the ASHA comparison")
  parser.add_argument("--fmnist-model", default=None, help="the model (default: the file's)")
  parser.add_argument("--stable-space", action="store_true",
                      help="search STABLE_SPACE (FedAvg's learning rates where trials do not "
                           "diverge) instead of the literature ranges")
  parser.add_argument("--keep", action="store_true", help="keep the sweep directories")
  args = parser.parse_args(argv)

  root = tempfile.mkdtemp(prefix="sweep_scaling_")
  try:
    with local_ray():
      print(f"machine: {os.cpu_count()} CPUs, Ray given 2; load average at start "
            f"{os.getloadavg()[0]:.2f}", flush=True)
      if not args.skip_cache:
        process_cache(root)
      if not args.skip_quickstart:
        quickstart(root)
      if not args.skip_scaling:
        scaling(root, args.trials, args.rounds)
      if not args.skip_asha:
        asha(root, args.fmnist_trials, args.fmnist_rounds, args.fmnist_optimizers.split(","),
             args.fmnist_model, args.stable_space)
      print(f"load average at the end {os.getloadavg()[0]:.2f}", flush=True)
  finally:
    if not args.keep:
      shutil.rmtree(root, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
