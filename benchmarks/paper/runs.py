"""The worker pool that runs the study's units, and the local cache beside it.

A unit (`units.Unit`) is one experiment (`run_experiment` on a config) or one
function call (the escape study). `run_units` loads every unit whose key has a
file in the store (`units.Store`, `<out>/results/`), runs the others in the
pool, and stores each as it completes, so an interrupted study loses only the
units in flight. An experiment interrupted half-way also resumes from its own
checkpoints when rerun on the same machine: its run directory is
`<out>/cache/runs/<name>-<key>`. The cache (`<out>/cache/`: run directories,
worker logs, the calibration runs, the log of wall times) is local and never
committed.

Experiments run in a pool of spawned worker processes (one TensorFlow thread
each); each worker's TensorFlow/TFF logging goes to `<out>/cache/logs/`. A pool
of one worker is the study's own process: its units run there one after the
other, in the same session a worker has (`unit_session`), without a second
process that would import TensorFlow and TFF again.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
import sys
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from tff_fedadamom.metric_names import ELAPSED_S, ROUND, TEST_ACCURACY

from benchmarks.paper.units import Store, Unit

CACHE_DIR = "cache"


class Cache:
  """Local, uncommitted state of a run under `<out>/cache/`."""

  def __init__(self, out_dir: str):
    self.root = os.path.join(os.path.abspath(out_dir), CACHE_DIR)
    os.makedirs(self.root, exist_ok=True)

  def run_dir(self, unit: Unit) -> str:
    """Where an experiment unit keeps its checkpoints and metrics."""
    return os.path.join(self.root, "runs", f"{unit.name}-{unit.key}")

  def store(self) -> Store:
    """Units that describe this machine only (the calibration runs)."""
    return Store(os.path.join(self.root, "units"))


# ---------------------------------------------------------------------------- workers


def unit_session(**kwargs):
  """The session units run in: one thread per kernel (the pool runs units side by
  side, one per worker) and no GPU. A worker applies it; so does the study's
  process when it runs the units itself (a pool of one worker)."""
  from tff_fedadamom.session import Session

  return Session(threads=1, environ={"CUDA_VISIBLE_DEVICES": ""}, **kwargs)


# How many structures' parts (built process, data, evaluator) a process running
# units keeps (`parts_cache.PartsCache`): the trials of one method share a structure
# (their hparams live in the state) and run one after the other.
PARTS_PER_PROCESS = 2
# A spawned worker's cache, made by its initializer (the worker's entry point).
_worker_parts = None


def become_unit_process(**session_kwargs) -> None:
  """Makes this process one that runs units (a worker, or the study's own with
  one worker): `unit_session(**session_kwargs)` applied, and TensorFlow's Python
  logger at errors only (its notes on tracing, such as the escape study's one
  trace per optimizer, are for whoever writes the traced code, not for the
  study's reader). For an entry point only: both are the process's."""
  import logging

  logging.getLogger("tensorflow").setLevel(logging.ERROR)
  unit_session(**session_kwargs).apply()


def _init_worker(log_dir: str) -> None:
  """Runs in each spawned worker, before TensorFlow is imported there: quiet
  TensorFlow, no GPU, stderr to a log file. The environment it edits is the
  worker's own; the parent's is never changed."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  os.makedirs(log_dir, exist_ok=True)
  log = open(os.path.join(log_dir, f"worker-{os.getpid()}.log"), "a", buffering=1)
  os.dup2(log.fileno(), 2)
  sys.stderr = log
  from tff_fedadamom.session import startup_imports

  # The worker is its process's entry point, running one unit at a time. It ends
  # with the study: a study killed (even with SIGKILL) cannot stop its pool.
  with startup_imports():
    become_unit_process(exit_with_parent=True)
    # Imported once per worker, so that no unit's time includes it.
    import tff_fedadamom.pipeline.runner  # noqa: F401 - TensorFlow, TFF, the run's modules
  from tff_fedadamom.pipeline.parts_cache import PartsCache

  global _worker_parts
  _worker_parts = PartsCache(PARTS_PER_PROCESS)


def run_experiment_unit(config: Mapping[str, Any], parts_cache=None) -> dict:
  """One experiment in this process; returns what the report needs from it.

  With `parts_cache` (a `parts_cache.PartsCache`), an in-process run takes its parts
  (data, process, evaluator) from it, which gives the same results as parts of
  its own. Parts of another backend are built for the unit and dropped with it:
  a `tff_cpp` process kept beyond the unit keeps TFF's executor service alive
  until interpreter exit, whose teardown then fails to end it, leaving an
  orphaned `worker_binary` that holds the run's output pipes."""
  from tff_fedadamom.config.schema import INPROCESS
  from tff_fedadamom.pipeline import outputs, run_experiment
  from tff_fedadamom.pipeline.parts import make_plan

  started = time.perf_counter()
  plan = make_plan(dict(config))
  parts = (parts_cache.get(plan) if parts_cache is not None and plan.backend == INPROCESS
           else None)
  # No final model or curves plot: the report is drawn from the units' records,
  # and the plot alone took 0.19 s a unit (3.0 s of the quick study's 16 runs).
  result = run_experiment(plan, progress=False, parts=parts, model_and_plot=False)
  summary = result.summary
  rows = outputs.read_metrics(result.output_dir)
  elapsed = [float(r[ELAPSED_S]) for r in rows if ELAPSED_S in r]
  record = {
      "status": summary.get("status"),
      "final_test_accuracy": summary.get("final_test_accuracy"),
      "best_test_accuracy": summary.get("best_test_accuracy"),
      "best_round": summary.get("best_round"),
      "final_test_loss": summary.get("final_test_loss"),
      "rounds_to_target": summary.get("rounds_to_target"),
      "rounds_completed": summary.get("rounds_completed"),
      "history": summary.get("history"),
      "wall_time_s": summary.get("wall_time_s"),
      "total_s": round(time.perf_counter() - started, 3),
      "seed": config.get("seed"),
      "server": {k: v for k, v in config["server"].items()},
      "client_learning_rate": config["client"]["learning_rate"],
      # Seconds of each round (evaluation included where there was one): what the
      # time estimate is made of.
      "round_seconds": [round(b - a, 4) for a, b in zip([0.0] + elapsed, elapsed)],
      "eval_rounds": [int(r[ROUND]) for r in rows if TEST_ACCURACY in r],
  }
  return record


def calibration_unit(config: Mapping[str, Any], warm_up: bool = True) -> dict:
  """`run_experiment_unit` after a 2-round warm-up run in the same process, so that
  the measured run pays only what every later run in a worker pays."""
  if warm_up:
    warm = dict(config, rounds=2, eval_every=2, checkpoint_every=2,
                output_dir=config["output_dir"] + "-warmup", name="warmup")
    run_experiment_unit(warm)
  return run_experiment_unit(config)


def call_unit(fn_path: str, kwargs: Mapping[str, Any]) -> Any:
  """Calls `module:function` with `kwargs` (for non-experiment units)."""
  import importlib

  module, name = fn_path.split(":")
  return getattr(importlib.import_module(module), name)(**kwargs)


class InlineExecutor:
  """Runs each call when it is submitted, in this process: the pool of one worker.
  The caller submits one unit at a time, so that each is stored before the next
  starts (`completed`)."""

  runs_inline = True

  def __init__(self):
    from tff_fedadamom.pipeline.parts_cache import PartsCache

    self.parts = PartsCache(PARTS_PER_PROCESS)

  def submit(self, fn, *args) -> futures.Future:
    future: futures.Future = futures.Future()
    try:
      future.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001 - the unit's failure, reported by its caller
      future.set_exception(e)
    return future

  def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
    del wait, cancel_futures


class Pool:
  """A lazily started pool of spawned workers, shared by every study; with one
  worker, the calling process itself (`InlineExecutor`), which must then have
  become a unit process (`become_unit_process`)."""

  def __init__(self, workers: int, log_dir: str):
    self.workers = workers
    self.log_dir = log_dir
    self._executor = None

  def executor(self):
    if self._executor is None and self.workers == 1:
      self._executor = InlineExecutor()
    if self._executor is None:
      self._executor = futures.ProcessPoolExecutor(
          max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
          initializer=_init_worker, initargs=(self.log_dir,))
    return self._executor

  def shutdown(self, cancel: bool = False) -> None:
    """Waits for the workers to finish; with `cancel`, ends them now (SIGTERM: each
    ends its TFF worker and exits; completed units are already cached)."""
    if self._executor is None:
      return
    if cancel:
      for process in list((getattr(self._executor, "_processes", None) or {}).values()):
        if process.is_alive():
          process.terminate()
    self._executor.shutdown(wait=not cancel, cancel_futures=cancel)
    self._executor = None


def timed_unit(config: Optional[Mapping[str, Any]], fn: Optional[str],
               kwargs: Mapping[str, Any], methods: Sequence[str], parts_cache=None) -> tuple:
  """Runs one unit in a worker: (its result, its wall seconds, the fingerprints
  of its methods, computed here once per worker and method). `parts_cache`: the
  running process's (a spawned worker's own by default)."""
  from benchmarks.paper import fingerprint

  started = time.perf_counter()
  if config is not None:
    result = run_experiment_unit(
        config, parts_cache if parts_cache is not None else _worker_parts)
  else:
    result = call_unit(fn, kwargs)
  seconds = time.perf_counter() - started
  return result, seconds, dict(fingerprint.fingerprints(methods))


def completed(units: Sequence[Unit], pool: Pool,
              run_dir: Callable[[Unit], str]) -> Iterator[tuple[Unit, futures.Future]]:
  """Runs every unit in the pool, an experiment writing to `run_dir(unit)`, and
  yields (unit, its done future) as each completes."""
  if not units:
    return
  executor = pool.executor()
  calls = []
  for unit in units:
    config = None
    if unit.config is not None:
      config = dict(unit.config, output_dir=run_dir(unit), name=unit.name)
    calls.append((unit, (timed_unit, config, unit.fn, unit.kwargs, unit.methods)))
  if getattr(executor, "runs_inline", False):
    for unit, call in calls:
      yield unit, executor.submit(*call, executor.parts)
    return
  pending = {executor.submit(*call): unit for unit, call in calls}
  for future in futures.as_completed(pending):
    yield pending[future], future


def _done_line(unit: Unit, result: Any) -> str:
  extra = ""
  if isinstance(result, Mapping) and "final_test_accuracy" in result:
    acc = result.get("final_test_accuracy")
    extra = (f" final acc {acc:.4f}" if isinstance(acc, (int, float)) else "") + \
        f" ({result.get('status')}, {result.get('total_s', 0):.0f}s)"
  return f"{unit.name}{extra}"


def run_units(units: Sequence[Unit], store: Store, cache: Cache, pool: Pool, *,
              log: Callable[[str], None] = print, label: str = "",
              execute: bool = True) -> dict:
  """Runs every unit whose key has no file in `store` (in parallel), storing
  each as it completes.

  Returns {name: result} for all units. A unit that raises is logged and left
  out: its result is missing, the studies' summaries count the seeds they got,
  the report marks every cell with fewer seeds than planned, and `reproduce`
  exits non-zero; a rerun tries the unit again. With `execute=False` only the
  stored results are returned.
  """
  results: dict[str, Any] = {}
  todo = []
  for unit in units:
    stored = store.get(unit)
    if stored is not None:
      results[unit.name] = stored
    else:
      todo.append(unit)
  if not execute:
    if todo:
      log(f"  {label}: {len(todo)} of {len(units)} units not run yet")
    return results
  if not todo:
    if units:
      log(f"  {label}: all {len(units)} units stored")
    return results
  log(f"  {label}: {len(todo)} of {len(units)} units to run "
      f"({len(units) - len(todo)} stored)")
  started = time.perf_counter()
  for done, (unit, future) in enumerate(completed(todo, pool, cache.run_dir), 1):
    try:
      result, seconds, fingerprints = future.result()
      unit.adopt_fingerprints(fingerprints)
    except Exception as e:  # noqa: BLE001 - reported, the rest continues
      log(f"    [{done}/{len(todo)}] {unit.name}: FAILED: {type(e).__name__}: "
          f"{str(e).splitlines()[0] if str(e) else ''}")
      continue
    store.put(unit, result, seconds)
    results[unit.name] = result
    log(f"    [{done}/{len(todo)}] {_done_line(unit, result)}; "
        f"{time.perf_counter() - started:.0f}s elapsed")
  return results
