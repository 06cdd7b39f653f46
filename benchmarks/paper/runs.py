"""The worker pool that runs the study's units, and the local cache beside it.

A process that runs units keeps the parts (`parts_cache.PartsCache`: built
process, data, evaluator) of the last `PARTS_PER_PROCESS` structures: the trials
of one method share one, their hparams living in the state.
"""

from __future__ import annotations

import concurrent.futures as futures
import importlib
import multiprocessing
import os
import sys
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from tff_fedadamom.metric_names import (DROPPED, ELAPSED_S, MAX_STALENESS, MEAN_STALENESS,
                                        ROUND, TEST_ACCURACY, VIRTUAL_TIME)

from benchmarks.paper.units import Store, Unit

CACHE_DIR = "cache"
# The columns of every server step of an asynchronous run a unit keeps (its history
# keeps only evaluated rounds): the report states the staleness its runs saw.
ASYNC_COLUMNS = (VIRTUAL_TIME, MEAN_STALENESS, MAX_STALENESS, DROPPED)
PARTS_PER_PROCESS = 2
_worker_parts = None  # a spawned worker's PartsCache, made by its initializer


class Cache:
  """Local, uncommitted state under `<out>/cache/`."""

  def __init__(self, out_dir: str):
    self.root = os.path.join(os.path.abspath(out_dir), CACHE_DIR)
    os.makedirs(self.root, exist_ok=True)

  def run_dir(self, unit: Unit) -> str:
    return os.path.join(self.root, "runs", f"{unit.name}-{unit.key}")


def become_unit_process(**session_kwargs) -> None:
  """Makes this process (an entry point's) one that runs units: one thread per
  kernel, no GPU, TensorFlow's Python logger at errors only."""
  import logging

  from tff_fedadamom.session import Session

  logging.getLogger("tensorflow").setLevel(logging.ERROR)
  Session(threads=1, environ={"CUDA_VISIBLE_DEVICES": ""}, **session_kwargs).apply()


def _init_worker(log_dir: str) -> None:
  """Runs in each spawned worker before TensorFlow is imported there: stderr to a
  log file, the unit session; the worker ends with the study, even on SIGKILL."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  os.makedirs(log_dir, exist_ok=True)
  log = open(os.path.join(log_dir, f"worker-{os.getpid()}.log"), "a", buffering=1)
  os.dup2(log.fileno(), 2)
  sys.stderr = log
  from tff_fedadamom.session import startup_imports

  with startup_imports():
    become_unit_process(exit_with_parent=True)
    import tff_fedadamom.experiment.runner  # noqa: F401 - once per worker, in no unit's time
  from tff_fedadamom.experiment.parts_cache import PartsCache

  global _worker_parts
  _worker_parts = PartsCache(PARTS_PER_PROCESS)


def run_experiment_unit(config: Mapping[str, Any], parts_cache=None) -> dict:
  """One experiment in this process; returns what the report needs from it.

  Only an in-process run takes its parts from `parts_cache`: a kept `tff_cpp`
  process would keep TFF's executor service alive until interpreter exit."""
  from tff_fedadamom.config.schema import INPROCESS
  from tff_fedadamom.experiment import outputs, run_experiment
  from tff_fedadamom.experiment.parts import make_plan

  started = time.perf_counter()
  plan = make_plan(dict(config))
  parts = (parts_cache.get(plan) if parts_cache is not None and plan.backend == INPROCESS
           else None)
  # No final model or curves plot: the report is drawn from the units' records.
  result = run_experiment(plan, progress=False, parts=parts, model_and_plot=False)
  rows = outputs.read_metrics(result.output_dir)
  elapsed = [float(r[ELAPSED_S]) for r in rows if ELAPSED_S in r]
  keys = ("status", "final_test_accuracy", "best_test_accuracy", "best_round",
          "final_test_loss", "rounds_to_target", "rounds_completed", "history",
          "wall_time_s")
  steps = [{ROUND: int(r[ROUND]), **{k: r[k] for k in ASYNC_COLUMNS if k in r}}
           for r in rows if MEAN_STALENESS in r]
  return {**{k: result.summary.get(k) for k in keys},
          "total_s": round(time.perf_counter() - started, 3), "seed": config.get("seed"),
          "server": dict(config["server"]),
          "client_learning_rate": config["client"]["learning_rate"],
          "round_seconds": [round(b - a, 4) for a, b in zip([0.0] + elapsed, elapsed)],
          "eval_rounds": [int(r[ROUND]) for r in rows if TEST_ACCURACY in r],
          **({"async_history": steps} if steps else {})}


def timed_unit(config, fn, kwargs, parts_cache=None) -> tuple:
  """(result, wall seconds) of an experiment `config`, or of `fn`
  ("module:function") called with `kwargs`."""
  started = time.perf_counter()
  if config is not None:
    result = run_experiment_unit(config, _worker_parts if parts_cache is None else parts_cache)
  else:
    module, name = fn.split(":")
    result = getattr(importlib.import_module(module), name)(**kwargs)
  return result, time.perf_counter() - started


class Pool:
  """A lazily started pool of spawned workers; with one worker, the calling
  process itself, which must then have become a unit process."""

  def __init__(self, workers: int, log_dir: str):
    self.workers, self.log_dir = workers, log_dir
    self._executor = self._parts = None

  def completed(self, units: Sequence[Unit],
                run_dir: Callable[[Unit], str]) -> Iterator[tuple]:
    """(unit, done future) of each unit as it completes, an experiment writing to
    `run_dir(unit)`."""
    if not units:
      return
    calls = [(unit, (None if unit.config is None else dict(
        unit.config, output_dir=run_dir(unit), name=unit.name), unit.fn, unit.kwargs))
             for unit in units]
    if self.workers == 1:
      from tff_fedadamom.experiment.parts_cache import PartsCache

      if self._parts is None:
        self._parts = PartsCache(PARTS_PER_PROCESS)
      for tag, args in calls:
        future: futures.Future = futures.Future()
        try:
          future.set_result(timed_unit(*args, parts_cache=self._parts))
        except Exception as e:  # noqa: BLE001 - the unit's failure, reported by its caller
          future.set_exception(e)
        yield tag, future
      return
    if self._executor is None:
      self._executor = futures.ProcessPoolExecutor(
          max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
          initializer=_init_worker, initargs=(self.log_dir,))
    pending = {self._executor.submit(timed_unit, *args): tag for tag, args in calls}
    for future in futures.as_completed(pending):
      yield pending[future], future

  def shutdown(self, cancel: bool = False) -> None:
    """Waits for the workers; with `cancel`, ends them now (SIGTERM)."""
    if self._executor is None:
      return
    if cancel:
      for process in list((getattr(self._executor, "_processes", None) or {}).values()):
        if process.is_alive():
          process.terminate()
    self._executor.shutdown(wait=not cancel, cancel_futures=cancel)
    self._executor = None


def run_units(units: Sequence[Unit], store: Store, cache: Cache, pool: Pool, *,
              log: Callable[[str], None] = print, label: str = "",
              execute: bool = True) -> dict:
  """{name: result} of `units`: the stored ones loaded, the others (with
  `execute`) run and stored as each completes. A unit that raises is logged and
  left out (the report marks the cells short of their plan)."""
  stored = {unit.name: store.get(unit) for unit in units}
  results = {name: result for name, result in stored.items() if result is not None}
  todo = [unit for unit in units if stored[unit.name] is None]
  if not todo or not execute:
    if units:
      log(f"  {label}: " + (f"{len(todo)} of {len(units)} units not stored" if todo
                            else f"all {len(units)} units stored"))
    return results
  log(f"  {label}: {len(todo)} of {len(units)} units to run "
      f"({len(units) - len(todo)} stored)")
  started = time.perf_counter()
  for done, (unit, future) in enumerate(pool.completed(todo, cache.run_dir), 1):
    try:
      result, seconds = future.result()
    except Exception as e:  # noqa: BLE001 - reported, the rest continues
      log(f"    [{done}/{len(todo)}] {unit.name}: FAILED: {type(e).__name__}: "
          f"{str(e).splitlines()[0] if str(e) else ''}")
      continue
    store.put(unit, result, seconds)
    results[unit.name] = result
    line = unit.name
    if isinstance(result, Mapping) and "final_test_accuracy" in result:
      acc = result["final_test_accuracy"]
      line += (f" final acc {acc:.4f}" if isinstance(acc, (int, float)) else "") + (
          f" ({result.get('status')}, {result.get('total_s', 0):.0f}s)")
    log(f"    [{done}/{len(todo)}] {line}; {time.perf_counter() - started:.0f}s elapsed")
  return results
