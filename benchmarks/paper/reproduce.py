"""Reproduce the FedAdamom paper's claims at laptop scale and write REPORT.md.

    .venv/bin/python -m benchmarks.paper.reproduce                 # full: ~100 min on 2 cores with six methods, ~3.9 h estimated with ten
    .venv/bin/python -m benchmarks.paper.reproduce --quick --out runs/paper-quick   # under a minute
    .venv/bin/python -m benchmarks.paper.reproduce --report-only   # rebuild from the stored units
    .venv/bin/python -m benchmarks.paper.reproduce --verify 3      # re-run 3 stored units

Stages (see plan.py for every budget):
  0. calibration: one short Fashion-MNIST and one Shakespeare run measure round and
     start-up times on this machine; the time estimate is printed from them;
  1. equal-budget tuning of every method of `plan.OPTIMIZERS` (Fashion-MNIST
     Dir(0.3) and i.i.d., Shakespeare), in process (every trial a unit) or
     through tuning/ (Ray Tune);
  2. every other run, in a pool of worker processes: the best configs with several
     seeds (studies 1, 2), FedAdamom's beta_2 grid (3), the escape simulation (4),
     FedAdam/FedAdamom across Dirichlet alphas (5);
  3. results.json (every number of the report, the command and the run's timings),
     then REPORT.md and plots/ rendered from it, in the output directory.

Every completed unit (a tuning trial, a final run, the escape simulation) is
written to <out>/results/ as it completes (units.py; committed to git with
--commit-units), keyed by its config and the numerics fingerprint of its
methods: rerunning after an interruption, on this machine or any other with
those files, runs only the units not stored. Run directories with checkpoints
(an interrupted experiment resumes from its last one on the same machine), the
calibration runs and the logs are in the local <out>/cache/.
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

from benchmarks.paper import calibration
from benchmarks.paper import plan
from benchmarks.paper import report as report_lib
from benchmarks.paper import runs as runs_lib
from benchmarks.paper import studies
from benchmarks.paper import units as units_lib
from benchmarks.paper import verify as verify_lib

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = {"full": HERE, "quick": os.path.join("runs", "paper-quick")}
RESULTS_FILE = "results.json"


class Logger:
  def __init__(self, path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    self._file = open(path, "a", buffering=1)

  def __call__(self, line: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {line}", flush=True)
    self._file.write(f"[{stamp}] {line}\n")


# ---------------------------------------------------------------------------- the run


def collect(ctx: studies.Context, b: plan.Budget, log) -> dict:
  """Tunes, runs (or, with ctx.execute False, reads the stored units) and summarizes."""
  results: dict[str, Any] = {}
  log("tuning (equal budget per optimizer)")
  # Shakespeare first: its trials cost the most (their char-LSTM's build and
  # rounds), and the batch runs in this order. The escape simulation needs no
  # tuning: it runs in the same batch (in process), filling the pool.
  requests = {"shakespeare": (plan.shakespeare_base(b), b.shakespeare,
                              plan.SHAKESPEARE_CLIENT_LR, b.shakespeare_methods)}
  requests.update({f"fmnist-{part}": (plan.fmnist_base(b, partition), b.fmnist,
                                      plan.FMNIST_CLIENT_LR, plan.OPTIMIZERS)
                   for part, partition in b.partition_items().items()})
  escape_unit = studies.escape_unit(ctx)
  compared = studies.compare(ctx, requests, alongside=[escape_unit])
  fmnist_cmp = {part: compared[f"fmnist-{part}"] for part in b.partitions
                if f"fmnist-{part}" in compared}
  shakes_cmp = compared.get("shakespeare")

  log("runs: best configs x seeds, beta_2 grid, heterogeneity, escape simulation")
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
    if unit.name not in seen:
      seen.add(unit.name)
      unique.append(unit)
  done = ctx.run(unique, "runs")

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
  if escape_unit.name in done:
    results["escape"] = studies.summarize_escape(done[escape_unit.name],
                                                 bootstrap=200 if b.mode == "full" else 30)
  return results


def compute_seconds(store: units_lib.Store) -> float:
  """Sum of the wall seconds of every stored unit (over workers)."""
  return sum(float(r.get("wall_time_s") or 0.0) for r in store.records())


def unit_commits(store: units_lib.Store) -> str:
  """The commits the stored units were computed from, with their unit counts."""
  counts: dict[str, int] = {}
  for r in store.records():
    commit = (r.get("source_commit") or "unknown")[:10]
    commit += " (uncommitted changes)" if r.get("source_dirty") else ""
    counts[commit] = counts.get(commit, 0) + 1
  return ", ".join(f"{c}: {n} unit(s)" for c, n in sorted(counts.items())) or "-"


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
                      help="tiny budgets (about a minute): checks the whole pipeline, "
                      "no conclusions")
  parser.add_argument("--out", default=None,
                      help="output directory (default: benchmarks/paper for the full run, "
                      "runs/paper-quick with --quick); units go to <out>/results/")
  parser.add_argument("--tuner", choices=("ray", "inprocess"), default=None,
                      help="tuning backend: 'inprocess' (the default: every trial a unit, "
                      "stored as it completes) or 'ray' (tuning/, Ray Tune; the sweep is "
                      "cached locally as a whole)")
  parser.add_argument("--workers", type=int, default=None,
                      help="experiments in parallel, each in a worker process (default 2); "
                      "with 1 they run in this process, one after the other")
  parser.add_argument("--commit-units", action="store_true",
                      help="git-commit each unit file as it is written (the output "
                      "directory must be inside a git work tree; nothing is pushed)")
  parser.add_argument("--report-only", action="store_true",
                      help="rebuild results.json, REPORT.md and plots/ from the stored "
                      "units (from <out>/results.json when there are none); run nothing")
  parser.add_argument("--verify", type=int, default=None, metavar="K",
                      help="run K stored units again (chosen by --verify-seed) and exit "
                      "non-zero unless every result is identical")
  parser.add_argument("--verify-seed", type=int, default=0,
                      help="seed that chooses the units of --verify (default 0)")
  parser.add_argument("--estimate-only", action="store_true",
                      help="run (or reuse) the two calibration runs, print the time "
                      "estimate and stop")
  args = parser.parse_args(argv)
  if args.verify is not None and args.verify < 1:
    parser.error(f"--verify: K must be a positive number of units, got {args.verify}")
  return args


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


def _read_results(out: str, log) -> Optional[dict]:
  path = os.path.join(out, RESULTS_FILE)
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    log(f"cannot read {path}: {e}")
    return None


def stored_timings(store: units_lib.Store) -> dict:
  return {"compute in all stored units (sum over workers)": calibration.minutes(compute_seconds(store)),
          "units (stored in results/) by the commit they were computed from":
              unit_commits(store)}


def _write_doc(ctx: studies.Context, out: str, command: str, results: Mapping,
               timings: Mapping, log) -> int:
  """results.json, then REPORT.md and plots from it; the exit status."""
  from tff_fedadamom.atomic_io import atomic_write_json

  doc = {"mode": ctx.budget.mode, "backend": ctx.backend, "command": command,
         "methods": methods(), "results": results, "budget": dataclasses.asdict(ctx.budget),
         "timings": dict(timings)}
  atomic_write_json(os.path.join(out, RESULTS_FILE), doc)
  log(f"wrote {os.path.join(out, RESULTS_FILE)}")
  return _finish(out, doc, log)


def report_only(ctx: studies.Context, out: str, command: str, log) -> int:
  """results.json, REPORT.md and plots from the stored units, running nothing (a
  unit not stored is missing from the report, which says so); without stored
  units, REPORT.md and plots from `<out>/results.json` as it is. The run's
  timings that no unit holds (wall time, estimate) are kept from results.json."""
  previous = _read_results(out, log)
  if not ctx.store.records():
    if previous is None:
      log(f"--report-only: no units in {ctx.store.root} and no {RESULTS_FILE} in {out}")
      return 2
    return _finish(out, previous, log)
  results = collect(ctx, ctx.budget, log)
  timings = dict((previous or {}).get("timings") or {})
  timings.update(stored_timings(ctx.store))
  return _write_doc(ctx, out, command, results, timings, log)


def run(ctx: studies.Context, out: str, command: str, estimate_only: bool) -> int:
  """Calibration, the studies, results.json and the report."""
  b, log = ctx.budget, ctx.log
  started = time.perf_counter()
  log(f"reproduce ({b.mode}, tuner {ctx.backend}, {b.workers} workers) -> {out}; "
      f"units in {ctx.store.root}" + (", committed as they complete" if ctx.store.commit
                                       else ""))
  timings: dict[str, Any] = dict(calibration.calibrate(ctx) or {})
  if estimate_only:
    if b.mode == "quick":
      log("--estimate-only: the quick run has no calibration runs; it estimates from its "
          "own units after running them")
    return 0
  results = collect(ctx, b, log)
  ctx.pool.shutdown()
  if b.mode == "quick":
    timings.update(calibration.from_units(ctx) or {})
  walls = _wall_times(ctx.cache, time.perf_counter() - started)
  timings.update({
      "mode": b.mode, "tuning backend": ctx.backend, "workers": b.workers,
      "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                 f"{platform.python_version()}",
      "wall time": (f"{calibration.minutes(sum(walls))} over {len(walls)} invocation(s) that ran "
                    f"units (the last: {calibration.minutes(walls[-1])})"),
      **stored_timings(ctx.store),
      "budget": json.dumps({k: v for k, v in dataclasses.asdict(b).items()
                            if k not in ("escape",)}, default=str),
  })
  return _write_doc(ctx, out, command, results, timings, log)


def _command(args) -> str:
  return (".venv/bin/python -m benchmarks.paper.reproduce" + (" --quick" if args.quick else "")
          + (f" --out {args.out}" if args.out else "")
          + (f" --tuner {args.tuner}" if args.tuner else ""))


def main(argv=None) -> int:
  from tff_fedadamom.session import Session, startup_imports

  args = parse_args(argv)
  mode = "quick" if args.quick else "full"
  b = plan.budget(mode, args.workers)
  # This command is its process's entry point; with one worker its units run here,
  # in a worker's session and with a worker's logging.
  with startup_imports():
    if b.workers == 1:
      runs_lib.become_unit_process()
    else:
      Session().apply()
    import tff_fedadamom.pipeline.runner  # noqa: F401 - what calibration and the units run
  out = os.path.abspath(args.out or DEFAULT_OUT[mode])
  os.makedirs(out, exist_ok=True)
  cache = runs_lib.Cache(out)
  log = Logger(os.path.join(cache.root, "reproduce.log"))
  results_dir = os.path.join(out, units_lib.RESULTS_DIR)
  try:
    store = units_lib.Store(results_dir, commit=args.commit_units,
                            source=units_lib.source_commit(HERE, exclude=results_dir))
  except ValueError as e:
    log(f"--commit-units: {e}")
    return 2
  pool = runs_lib.Pool(b.workers, os.path.join(cache.root, "logs"))
  ctx = studies.Context(b, store, cache, pool, args.tuner or "inprocess", log=log,
                        execute=not args.report_only)
  try:
    if args.verify is not None:
      return verify_lib.verify(store, args.verify, args.verify_seed, cache, pool, log)
    if args.report_only:
      return report_only(ctx, out, _command(args), log)
    return run(ctx, out, _command(args), args.estimate_only)
  except KeyboardInterrupt:
    log("interrupted: rerun the same command to continue (completed units are stored)")
    pool.shutdown(cancel=True)
    return 130
  finally:
    pool.shutdown()
    _stop_resource_tracker()


def _stop_resource_tracker() -> None:
  """Ends multiprocessing's resource tracker (the spawn pool's start made it) and
  reaps it. Left alone, it would read the end of its pipe only once this process
  has exited, and outlive the command by a moment. A later pool starts it again."""
  from multiprocessing import resource_tracker

  stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # noqa: SLF001
  if stop is not None:
    stop()


if __name__ == "__main__":
  sys.exit(main())
