"""Reproduce the FedAdamom paper's claims at laptop scale and write REPORT.md
(the commands, their options and exit statuses: benchmarks/paper/README.md).

results.json holds every number of the report; REPORT.md and plots/ are rendered from it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from typing import Callable, Mapping, Sequence

from benchmarks.paper import plan
from benchmarks.paper import report as report_lib
from benchmarks.paper import runs as runs_lib
from benchmarks.paper import studies
from benchmarks.paper import units as units_lib

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = {"full": HERE, "quick": os.path.join("runs", "paper-quick")}
RESULTS_FILE = "results.json"
SHRINKS = 3  # the exit status of a --report-only that would write less


def log(line: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def minutes(seconds: float) -> str:
  return f"{seconds / 60:.1f} min"


def stored_timings(store: units_lib.Store) -> dict:
  records = store.records()
  counts = collections.Counter((r.get("source_commit") or "unknown")[:10] + (
      " (uncommitted changes)" if r.get("source_dirty") else "") for r in records)
  return {"compute in all stored units (sum over workers)":
              minutes(sum(float(r.get("wall_time_s") or 0.0) for r in records)),
          "units (stored in results/) by the commit they were computed from":
              ", ".join(f"{c}: {n} unit(s)" for c, n in sorted(counts.items())) or "-"}


def document(ctx: studies.Context, command: str, results: Mapping, timings: Mapping) -> dict:
  """results.json: the results, and each method's communication per round relative to FedAvg."""
  from tff_fedadamom.methods import get_spec

  methods = [{"name": m, "communication": get_spec(m).communication} for m in plan.OPTIMIZERS]
  return {"mode": ctx.budget.mode, "backend": plan.BACKEND, "command": command,
          "methods": methods, "results": results,
          "budget": dataclasses.asdict(ctx.budget), "timings": dict(timings)}


def write(out: str, doc: Mapping, log) -> int:
  """results.json, then REPORT.md and plots from it; 1 if the results are incomplete."""
  from tff_fedadamom.atomic_io import atomic_write_json

  atomic_write_json(os.path.join(out, RESULTS_FILE), doc)
  log(f"wrote {os.path.join(out, RESULTS_FILE)} and {report_lib.write_report(out, doc)}")
  shortfalls = report_lib.incomplete(doc)
  if shortfalls:
    log("INCOMPLETE (listed in the report; rerun to continue): " + "; ".join(shortfalls))
    return 1
  return 0


def report_only(ctx: studies.Context, out: str, command: str) -> int:
  """results.json, REPORT.md and plots from the stored units (without any, from
  `<out>/results.json`), keeping the timings no unit holds; nothing is written
  when the stored units give less than results.json holds."""
  try:
    with open(os.path.join(out, RESULTS_FILE)) as f:
      previous = json.load(f)
  except (OSError, ValueError):
    previous = None
  if not ctx.store.records():
    if previous is None:
      ctx.log(f"--report-only: no units in {ctx.store.root} and no {RESULTS_FILE} in {out}")
      return 2
    ctx.log(f"wrote {report_lib.write_report(out, previous)}")
    return 1 if report_lib.incomplete(previous) else 0
  timings = {**((previous or {}).get("timings") or {}), **stored_timings(ctx.store)}
  doc = document(ctx, command, studies.collect(ctx), timings)
  lost = report_lib.shrinkage(previous, doc) if previous else []
  if lost:
    ctx.log(f"--report-only: wrote nothing: the stored units give less than {out}/"
            f"{RESULTS_FILE} holds ({len(lost)} cell(s)): " + "; ".join(lost[:8])
            + ("; ..." if len(lost) > 8 else ""))
    reasons = collections.Counter(ctx.missing.values()).most_common()  # ties: first seen first
    for reason, n in reasons[:6]:
      example = next(u for u, r in ctx.missing.items() if r == reason)
      ctx.log(f"  not stored: {n} unit(s), e.g. {example}: {reason}")
    if len(reasons) > 6:
      ctx.log(f"  not stored: ... and {len(reasons) - 6} other reasons")
    return SHRINKS
  return write(out, doc, ctx.log)


def run(ctx: studies.Context, out: str, command: str) -> int:
  b = ctx.budget
  started = time.perf_counter()
  ctx.log(f"reproduce ({b.mode}, {b.workers} workers) -> {out}; units in {ctx.store.root}"
          + (", committed as they complete" if ctx.store.commit else ""))
  results = studies.collect(ctx)
  ctx.pool.shutdown()
  timings = {"mode": b.mode, "workers": b.workers, "machine": units_lib.machine(),
             "wall time": f"{minutes(time.perf_counter() - started)} (this invocation)",
             **stored_timings(ctx.store),
             "budget": json.dumps({k: v for k, v in dataclasses.asdict(b).items()
                                   if k != "escape"}, default=str)}
  return write(out, document(ctx, command, results, timings), ctx.log)


# --verify K runs K stored units again: the check for what a unit's key does not cover (data
# pipeline, models, round loop, the platform's floating point). A unit stored on this machine
# reproduces exactly, timing fields aside; one stored on another within `TOLERANCE`:
# float32 kernels round differently on another CPU, and tens of rounds of non-convex training
# carry a last-bit difference into the accuracies. Half a point of accuracy (absolute) lies
# below the seed-to-seed spread of almost every cell of the report, while a changed pipeline,
# model or round loop moves accuracies by more; other floats, of other scales, get 2%
# (relative). A round index derived from accuracies may move to a neighbouring evaluation.
TOLERANCE = {"accuracy (absolute)": 0.005, "other floats (relative)": 0.02}
ROUND_KEYS = ("best_round", "rounds_to_target")


def choose(records: Sequence[dict], k: int, seed: int) -> list:
  ordered = sorted(records, key=lambda r: r["name"])
  return random.Random(seed).sample(ordered, min(k, len(ordered)))


def within_tolerance(stored: Mapping) -> Callable[[str, float, float], bool]:
  """`close(path, stored, now)` for `units.first_difference` under TOLERANCE."""
  evals = (stored.get("eval_rounds") or []) if isinstance(stored, Mapping) else []
  step = max((b - a for a, b in zip(evals, evals[1:])), default=0)
  acc, rel = TOLERANCE.values()

  def close(path: str, a, b) -> bool:
    if "accuracy" in path.rsplit(".", 1)[-1]:
      return abs(a - b) <= acc
    if any(f".{k}" in path for k in ROUND_KEYS):
      return abs(a - b) <= step
    if isinstance(a, int) and isinstance(b, int):
      return a == b
    return abs(a - b) <= rel * max(abs(a), abs(b))

  return close


def _short(value) -> str:
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


def verify(store: units_lib.Store, k: int, seed: int, cache: runs_lib.Cache,
           pool: runs_lib.Pool, log: Callable[[str], None] = print) -> int:
  """0 when all K chosen units reproduce, 1 otherwise (also for a unit whose
  fingerprints no longer match), 2 without units."""
  records = store.records()
  if not records:
    log(f"--verify: no stored units under {store.root}")
    return 2
  chosen = choose(records, k, seed)
  here = units_lib.machine()
  log(f"--verify: {len(chosen)} of {len(records)} stored units (seed {seed}); this "
      f"machine: {here}; tolerance where a unit was stored on another machine: "
      + ", ".join(f"{name} {value:g}" for name, value in TOLERANCE.items())
      + "; round indices within one evaluation interval")
  failures, todo = [], {}
  for record in chosen:
    unit = units_lib.Unit.from_record(record)
    log(f"  {record['name']}: stored at commit {(record.get('source_commit') or 'unknown')[:10]}"
        + (" with uncommitted changes" if record.get("source_dirty") else "")
        + f", on {record.get('machine') or 'an unrecorded machine'}; compared "
        + ("exactly" if record.get("machine") == here else "within the tolerance"))
    if unit.key != units_lib.record_key(record):
      failures.append(f"{record['name']}: {store.why_missing(unit)}; run the study to "
                      "refresh it")
    else:
      todo[unit] = record
  fresh = tempfile.mkdtemp(prefix="verify-", dir=cache.root)
  for unit, future in pool.completed(
      list(todo), run_dir=lambda unit: os.path.join(fresh, f"{unit.name}-{unit.key}")):
    try:
      result, seconds = future.result()
    except Exception as e:  # noqa: BLE001 - a unit that fails does not verify
      failures.append(f"{unit.name}: failed: {type(e).__name__}: {e}")
      continue
    record = todo[unit]
    stored, now = units_lib.comparable(record["result"]), units_lib.comparable(result)
    diff = units_lib.first_difference(stored, now, close=(
        None if record.get("machine") == here else within_tolerance(stored)))
    if diff:
      failures.append(f"{unit.name}: {diff[0]}: stored {_short(diff[1])}, now {_short(diff[2])}")
    else:
      same = units_lib.first_difference(stored, now) is None
      log(f"  {unit.name}: " + ("identical" if same else "within the tolerance")
          + f" ({seconds:.0f}s)")
  for line in failures:
    log(f"  DIFFERS {line}")
  log(f"--verify: {len(chosen) - len(failures)} of {len(chosen)} units reproduce")
  return 1 if failures else 0


def parse_args(argv=None):
  parser = argparse.ArgumentParser(
      prog="python -m benchmarks.paper.reproduce",
      description="Reproduce the FedAdamom paper's claims at laptop scale; write REPORT.md.")
  parser.add_argument("--quick", action="store_true",
                      help="tiny budgets: checks the whole pipeline, no conclusions")
  parser.add_argument("--out", default=None,
                      help="output directory (default: benchmarks/paper for the full run, "
                      "runs/paper-quick with --quick); units go to <out>/results/")
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
                      "non-zero unless every result reproduces (reproduce.TOLERANCE)")
  parser.add_argument("--verify-seed", type=int, default=0,
                      help="seed that chooses the units of --verify (default 0)")
  args = parser.parse_args(argv)
  if args.verify is not None and args.verify < 1:
    parser.error(f"--verify: K must be a positive number of units, got {args.verify}")
  if args.workers is not None and args.workers < 1:
    parser.error(f"--workers: must be a positive number of processes, got {args.workers}")
  return args


def main(argv=None) -> int:
  from tff_fedadamom.session import Session, startup_imports

  args = parse_args(argv)
  mode = "quick" if args.quick else "full"
  b = plan.budget(mode, args.workers)
  # With one worker the units run in this process, in a worker's session.
  with startup_imports():
    if b.workers == 1:
      runs_lib.become_unit_process()
    else:
      Session().apply()
    import tff_fedadamom.experiment.runner  # noqa: F401 - what the units and keys need
  out = os.path.abspath(args.out or DEFAULT_OUT[mode])
  cache = runs_lib.Cache(out)  # makes <out>/cache/, and so <out>
  results_dir = os.path.join(out, units_lib.RESULTS_DIR)
  try:
    store = units_lib.Store(results_dir, commit=args.commit_units,
                            source=units_lib.source_commit(HERE, exclude=results_dir))
  except ValueError as e:
    log(f"--commit-units: {e}")
    return 2
  pool = runs_lib.Pool(b.workers, os.path.join(cache.root, "logs"))
  ctx = studies.Context(b, store, cache, pool, log=log, execute=not args.report_only)
  command = (".venv/bin/python -m benchmarks.paper.reproduce" + (" --quick" * args.quick)
             + (f" --out {args.out}" if args.out else ""))
  try:
    if args.verify is not None:
      return verify(store, args.verify, args.verify_seed, cache, pool, log)
    if args.report_only:
      return report_only(ctx, out, command)
    return run(ctx, out, command)
  except KeyboardInterrupt:
    log("interrupted: rerun the same command to continue (completed units are stored)")
    pool.shutdown(cancel=True)
    return 130
  finally:
    pool.shutdown()
    # Ends and reaps the spawn pool's resource tracker, which would outlive the command.
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # noqa: SLF001
    if stop is not None:
      stop()


if __name__ == "__main__":
  sys.exit(main())
