"""Reproduce the FedAdamom paper's claims at laptop scale and write REPORT.md.

    .venv/bin/python -m benchmarks.paper.reproduce                 # full: ~100 min on 2 cores with six methods, ~3.9 h estimated with ten
    .venv/bin/python -m benchmarks.paper.reproduce --quick --out runs/paper-quick   # minutes
    .venv/bin/python -m benchmarks.paper.reproduce --report-only   # rebuild from results.json

Stages (see plan.py for every budget):
  0. calibration: one short Fashion-MNIST and one Shakespeare run measure round and
     start-up times on this machine; the time estimate is printed from them;
  1. equal-budget tuning of every method of `plan.OPTIMIZERS` (Fashion-MNIST
     Dir(0.3) and i.i.d., Shakespeare) through tuning/ (Ray Tune) or the
     in-process backend;
  2. every other run, in a pool of worker processes: the best configs with several
     seeds (studies 1, 2), FedAdamom's beta_2 grid (3), the escape simulation (4),
     FedAdam/FedAdamom across Dirichlet alphas (5);
  3. results.json (every number of the report, the command and the run's timings),
     then REPORT.md and plots/ rendered from it, in the output directory.

Everything completed is cached under <out>/cache/ (JSON per unit, run directories
with checkpoints), so rerunning after an interruption continues where it stopped.
A unit that failed, or a study that could not run, leaves the report incomplete:
its cells say how many seeds they got, REPORT.md lists every shortfall and the
command exits with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from typing import Any, Mapping, Optional

from benchmarks.paper import plan
from benchmarks.paper import report as report_lib
from benchmarks.paper import runs as runs_lib
from benchmarks.paper import studies

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = {"full": HERE, "quick": os.path.join("runs", "paper-quick")}
RESULTS_FILE = "results.json"

# What one Ray Tune trial costs besides its rounds (Tune's bookkeeping and
# checkpoints, the trial's share of building each optimizer's process in the
# sweep's long-lived workers): the median trial of the quickstart sweep,
# measured by benchmarks/sweep_scaling.py on the development machine (5.8 s).
RAY_TRIAL_OVERHEAD_S = 6.0
RAY_SWEEP_OVERHEAD_S = 15.0 + 5.0   # ray.init + the sweep's one Tune experiment
# Escape simulation: seconds per particle-round of the vectorized FedAdamom step
# (the slowest of the three), measured on the development machine.
ESCAPE_S_PER_PARTICLE_ROUND = 2.2e-7


class Logger:
  def __init__(self, path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    self._file = open(path, "a", buffering=1)

  def __call__(self, line: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {line}", flush=True)
    self._file.write(f"[{stamp}] {line}\n")


# ---------------------------------------------------------------------------- calibration


def calibration_units(b: plan.Budget, cache: runs_lib.Cache) -> list:
  """A short Fashion-MNIST and a short Shakespeare run (side by side, as the pool
  runs everything), each evaluated once, at its last round, each after a warm-up
  run in its worker (see runs.calibration_unit)."""
  quick = b.mode == "quick"
  fm = plan.fmnist_base(b, plan.PARTITIONS["dir0.3"])
  fm.update(rounds=3 if quick else 10, seed=0)
  fm["server"] = {"optimizer": "fedadamom", "learning_rate": 1.0,
                  "client_weighting": "uniform"}
  fm["client"]["learning_rate"] = 0.1
  sh = plan.shakespeare_base(b)
  sh.update(rounds=3 if quick else 6, seed=0)
  units = []
  for key, config in (("calibration/fmnist", fm), ("calibration/shakespeare", sh)):
    config.update(eval_every=config["rounds"], checkpoint_every=config["rounds"],
                  name=key)
    unit = runs_lib.Unit(key, fn="benchmarks.paper.runs:calibration_unit", hash_of=config)
    # The quick run skips the warm-up: its estimate is not worth the seconds.
    unit.kwargs = {"config": config, "output_dir": cache.run_dir(key, unit.digest),
                   "warm_up": not quick}
    units.append(unit)
  return units


def per_round(result: Mapping) -> tuple:
  """(seconds per round, extra seconds per evaluation, fixed seconds per run) of a
  calibration run: the median round without an evaluation, the median extra of the
  rounds with one, and the rest of the run's time (process start, data, the first
  round's tracing, saving)."""
  seconds = result.get("round_seconds") or []
  evals = set(result.get("eval_rounds") or [])
  plain = [s for i, s in enumerate(seconds, 1) if i not in evals and i > 1]
  with_eval = [s for i, s in enumerate(seconds, 1) if i in evals and i > 1]
  total = float(result.get("total_s") or 0.0)
  if not plain:
    rounds = max(1, len(seconds))
    return total / rounds, 0.0, 0.0
  step = float(sorted(plain)[len(plain) // 2])
  extra = max(0.0, float(sorted(with_eval)[len(with_eval) // 2]) - step) if with_eval else 0.0
  fixed = max(0.0, total - step * len(seconds) - extra * len(evals))
  return step, extra, fixed


def estimate(b: plan.Budget, calib: Mapping, backend: str) -> dict:
  """Seconds per stage, from the calibration runs (cached units are not subtracted:
  this is the cost of a run from scratch)."""
  f_round, f_eval, f_start = per_round(calib["calibration/fmnist"])
  s_round, s_eval, s_start = per_round(calib["calibration/shakespeare"])
  # Evaluation cost folded into the per-round cost at each data set's eval_every.
  f_round += f_eval / b.fmnist.eval_every
  s_round += s_eval / b.shakespeare.eval_every
  n_opt = len(plan.OPTIMIZERS)
  w = b.workers

  def runs(n, rounds, spr, start):
    return n * (rounds * spr + start)

  tune_f = runs(len(b.partitions) * n_opt * b.fmnist.tune_trials, b.fmnist.tune_rounds,
                f_round, f_start)
  tune_s = runs(n_opt * b.shakespeare.tune_trials, b.shakespeare.tune_rounds, s_round, s_start)
  n_trials = (len(b.partitions) * b.fmnist.tune_trials + b.shakespeare.tune_trials) * n_opt
  if backend == "ray":
    tuning = (tune_f + tune_s + n_trials * RAY_TRIAL_OVERHEAD_S) / w \
        + 3 * RAY_SWEEP_OVERHEAD_S
  else:
    tuning = (tune_f + tune_s) / w
  finals_f = runs(len(b.partitions) * n_opt * len(b.fmnist.seeds), b.fmnist.rounds,
                  f_round, f_start)
  finals_s = runs(n_opt * len(b.shakespeare.seeds), b.shakespeare.rounds, s_round, s_start)
  beta2 = runs(len(b.partitions) * len(b.beta2_grid) * len(b.beta2_seeds),
               b.fmnist.rounds, f_round, f_start)
  new_hetero = [a for a in b.heterogeneity if a != "0.3"]
  hetero = runs(len(new_hetero) * 2 * len(b.hetero_seeds), b.fmnist.rounds, f_round, f_start)
  e = b.escape
  escape = 1.25 * ESCAPE_S_PER_PARTICLE_ROUND * e.max_rounds * e.particles * len(e.ks) + 20
  pool = (finals_f + finals_s + beta2 + hetero + escape) / w
  return {
      "seconds_per_round": {"fashion_mnist": f_round, "shakespeare": s_round},
      "start_up_s": {"fashion_mnist": f_start, "shakespeare": s_start},
      "tuning_s": tuning,
      "runs_s": pool,
      "escape_s": escape,
      "total_s": tuning + pool + 60.0,
  }


def _minutes(seconds: float) -> str:
  return f"{seconds / 60:.1f} min"


# ---------------------------------------------------------------------------- the run


def collect(ctx: studies.Context, b: plan.Budget, log) -> dict:
  """Tunes, runs (or, with ctx.execute False, reads from the cache) and summarizes."""
  results: dict[str, Any] = {}
  log("tuning (equal budget per optimizer)")
  fmnist_cmp = {}
  for part, partition in b.partition_items().items():
    cmp = studies.compare(ctx, f"fmnist-{part}", plan.fmnist_base(b, partition), b.fmnist,
                          plan.FMNIST_CLIENT_LR)
    if cmp is not None:
      fmnist_cmp[part] = cmp
  shakes_cmp = studies.compare(ctx, "shakespeare", plan.shakespeare_base(b), b.shakespeare,
                               plan.SHAKESPEARE_CLIENT_LR)

  log("runs: best configs x seeds, beta_2 grid, heterogeneity, escape simulation")
  escape_unit = studies.escape_unit(ctx)
  groups: dict[str, list] = {}
  if shakes_cmp is not None:
    groups["shakespeare"] = studies.finals_units(ctx, "shakespeare", shakes_cmp, b.shakespeare)
  for part, cmp in fmnist_cmp.items():
    groups[f"fmnist/{part}"] = studies.finals_units(ctx, f"fmnist/{part}", cmp, b.fmnist)
  if len(fmnist_cmp) == len(b.partitions):
    groups["beta2"] = studies.beta2_units(ctx, fmnist_cmp)
  if "dir0.3" in fmnist_cmp:
    groups["hetero"] = studies.hetero_units(ctx, fmnist_cmp)
  ordered = [escape_unit] + [u for units in groups.values() for u in units]
  unique, seen = [], set()
  for unit in ordered:
    if unit.key not in seen:
      seen.add(unit.key)
      unique.append(unit)
  done = runs_lib.run_units(unique, ctx.cache, ctx.pool, log=log, label="runs",
                            execute=ctx.execute)

  if fmnist_cmp:
    results["fmnist"] = {
        part: studies.summarize_comparison(f"fmnist/{part}", cmp, b.fmnist, done,
                                           groups[f"fmnist/{part}"])
        for part, cmp in fmnist_cmp.items()}
  if shakes_cmp is not None:
    results["shakespeare"] = studies.summarize_comparison(
        "shakespeare", shakes_cmp, b.shakespeare, done, groups["shakespeare"])
  if "beta2" in groups:
    results["beta2"] = studies.summarize_beta2(ctx, fmnist_cmp, done, groups["beta2"])
  if "hetero" in groups:
    results["hetero"] = studies.summarize_hetero(ctx, done, groups["hetero"])
  if escape_unit.key in done:
    results["escape"] = studies.summarize_escape(done[escape_unit.key],
                                                 bootstrap=200 if b.mode == "full" else 30)
  return results


def compute_seconds(cache: runs_lib.Cache) -> float:
  """Sum of the recorded durations of every cached experiment unit."""
  total = 0.0
  for root, _, files in os.walk(os.path.join(cache.root, "units")):
    for name in files:
      try:
        with open(os.path.join(root, name)) as f:
          result = json.load(f).get("result")
      except (OSError, ValueError):
        continue
      if isinstance(result, Mapping):
        total += float(result.get("total_s") or result.get("seconds") or 0.0)
  return total


def _wall_times(cache: runs_lib.Cache, elapsed: Optional[float]) -> list:
  """Wall seconds of every invocation that ran units; appends `elapsed` if given."""
  from tff_fedadamom.atomic_io import atomic_write_json

  path = os.path.join(cache.root, "wall_times.json")
  try:
    with open(path) as f:
      walls = [float(x) for x in json.load(f)]
  except (OSError, ValueError, TypeError):
    walls = []
  if elapsed is not None:
    walls.append(round(elapsed, 1))
    atomic_write_json(path, walls)
  return walls


def parse_args(argv=None):
  parser = argparse.ArgumentParser(
      prog="python -m benchmarks.paper.reproduce",
      description="Reproduce the FedAdamom paper's claims at laptop scale; write REPORT.md.")
  parser.add_argument("--quick", action="store_true",
                      help="tiny budgets (a few minutes): checks the whole pipeline, "
                      "no conclusions")
  parser.add_argument("--out", default=None,
                      help="output directory (default: benchmarks/paper for the full run, "
                      "runs/paper-quick with --quick)")
  parser.add_argument("--tuner", choices=("ray", "inprocess"), default=None,
                      help="tuning backend: 'ray' (tuning/, Ray Tune; the full run's "
                      "default) or 'inprocess' (same sweep without Ray; --quick's default)")
  parser.add_argument("--workers", type=int, default=None,
                      help="experiments in parallel (default 2)")
  parser.add_argument("--report-only", action="store_true",
                      help="rebuild REPORT.md and plots/ from <out>/results.json; run nothing")
  parser.add_argument("--estimate-only", action="store_true",
                      help="run (or reuse) the two calibration runs, print the time "
                      "estimate and stop")
  return parser.parse_args(argv)


def methods() -> list:
  """The compared methods, in the report's order, with their communication cost per
  round relative to FedAvg (the registry's `communication`)."""
  from tff_fedadamom.optimizers import get_spec

  return [{"name": opt, "communication": get_spec(opt).communication}
          for opt in plan.OPTIMIZERS]


def _finish(out: str, doc: Mapping, log) -> int:
  """Writes REPORT.md and plots from `doc`; 1 if the results are incomplete."""
  path = report_lib.write_report(out, doc)
  log(f"wrote {path}")
  shortfalls = report_lib.incomplete(doc)
  if shortfalls:
    log("INCOMPLETE (listed in the report; rerun to continue): " + "; ".join(shortfalls))
    return 1
  return 0


def report_only(out: str, log) -> int:
  """REPORT.md and plots from `<out>/results.json`."""
  try:
    with open(os.path.join(out, RESULTS_FILE)) as f:
      doc = json.load(f)
  except (OSError, ValueError) as e:
    log(f"--report-only: cannot read {os.path.join(out, RESULTS_FILE)}: {e}")
    return 2
  return _finish(out, doc, log)


def main(argv=None) -> int:
  args = parse_args(argv)
  mode = "quick" if args.quick else "full"
  b = plan.budget(mode, args.workers)
  backend = args.tuner or ("inprocess" if mode == "quick" else "ray")
  out = os.path.abspath(args.out or DEFAULT_OUT[mode])
  os.makedirs(out, exist_ok=True)
  cache = runs_lib.Cache(out)
  log = Logger(os.path.join(cache.root, "reproduce.log"))
  if args.report_only:
    return report_only(out, log)
  pool = runs_lib.Pool(b.workers, os.path.join(cache.root, "logs"))
  command = ".venv/bin/python -m benchmarks.paper.reproduce" + \
      (" --quick" if args.quick else "") + (f" --out {args.out}" if args.out else "") + \
      (f" --tuner {args.tuner}" if args.tuner else "")
  started = time.perf_counter()
  log(f"reproduce ({mode}, tuner {backend}, {b.workers} workers) -> {out}")
  ctx = studies.Context(b, cache, pool, backend, log=log)
  timings: dict[str, Any] = {}
  try:
    calib = runs_lib.run_units(calibration_units(b, cache), cache, pool, log=log,
                               label="calibration")
    if len(calib) == 2:
      est = estimate(b, calib, backend)
      log(f"measured: Fashion-MNIST {est['seconds_per_round']['fashion_mnist']:.2f} s/round "
          f"(+{est['start_up_s']['fashion_mnist']:.1f} s start-up per run), Shakespeare "
          f"{est['seconds_per_round']['shakespeare']:.2f} s/round "
          f"(+{est['start_up_s']['shakespeare']:.1f} s)")
      log(f"ESTIMATE for a run from scratch: {_minutes(est['total_s'])} (tuning "
          f"{_minutes(est['tuning_s'])}, other runs {_minutes(est['runs_s'])} incl. "
          f"escape simulation {_minutes(est['escape_s'])} of one worker); cached units "
          "are skipped")
      timings["estimate from calibration (from scratch)"] = _minutes(est["total_s"])
    if args.estimate_only:
      return 0
    results = collect(ctx, b, log)
  except KeyboardInterrupt:
    log("interrupted: rerun the same command to continue (completed units are cached)")
    pool.shutdown(cancel=True)
    return 130
  finally:
    pool.shutdown()
  elapsed = time.perf_counter() - started
  walls = _wall_times(cache, elapsed)
  timings.update({
      "mode": mode, "tuning backend": backend, "workers": b.workers,
      "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                 f"{platform.python_version()}",
      "wall time": (f"{_minutes(sum(walls))} over {len(walls)} invocation(s) that ran "
                    f"units (the last: {_minutes(walls[-1])})" if walls else "-"),
      "compute in all cached units (sum over workers)": _minutes(compute_seconds(cache)),
      "budget": json.dumps({k: v for k, v in dataclasses.asdict(b).items()
                            if k not in ("escape",)}, default=str),
  })
  from tff_fedadamom.atomic_io import atomic_write_json

  doc = {"mode": mode, "backend": backend, "command": command, "methods": methods(),
         "results": results, "budget": dataclasses.asdict(b), "timings": timings}
  atomic_write_json(os.path.join(out, RESULTS_FILE), doc)
  log(f"wrote {os.path.join(out, RESULTS_FILE)} ({_minutes(elapsed)})")
  return _finish(out, doc, log)


if __name__ == "__main__":
  sys.exit(main())
