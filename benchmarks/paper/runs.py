"""Units of work, their JSON cache, and the worker pool that runs them.

A unit is one experiment (`run_experiment` on a config) or one function call
(the escape study), named `<study>/<label>`. When it completes, its result is
written atomically to `<out>/cache/units/<study>/<label>.json` together with a
hash of what it ran and of the code that ran it (`code_version`: the bytes of
every source file a unit executes); a rerun skips every unit whose file holds
the same hash, so changed code runs its units again.
An experiment interrupted half-way resumes from its own checkpoints (its run
directory is `<out>/cache/runs/<study>/<label>-<hash>`), so an interrupted
reproduction loses at most the rounds since a unit's last checkpoint.

Experiments run in a pool of spawned worker processes (one TensorFlow thread
each); each worker's TensorFlow/TFF logging goes to `<out>/cache/logs/`.
"""

from __future__ import annotations

import concurrent.futures as futures
import functools
import glob
import hashlib
import json
import multiprocessing
import os
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from tff_fedadamom.atomic_io import atomic_write_json
from tff_fedadamom.metric_names import TEST_ACCURACY

CACHE_DIR = "cache"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a unit executes: the library and the sweep layer (every experiment and
# tuning trial), and the modules of this package that define a unit's work
# (experiment records, tuning outcomes, the escape simulation). Glob patterns
# relative to the repository root.
UNIT_SOURCES = ("tff_fedadamom/**/*.py", "tuning/**/*.py", "benchmarks/paper/runs.py",
                "benchmarks/paper/tune.py", "benchmarks/paper/escape.py")


def code_version(root: str = REPO, patterns: Sequence[str] = UNIT_SOURCES) -> str:
  """A short hash of the bytes (and repository paths) of every file matching
  `patterns` under `root`: a unit cached by other code does not match."""
  paths = sorted({os.path.relpath(p, root) for pattern in patterns
                  for p in glob.glob(os.path.join(root, pattern), recursive=True)})
  digest = hashlib.sha1()
  for rel in paths:
    digest.update(rel.replace(os.sep, "/").encode() + b"\0")
    with open(os.path.join(root, rel), "rb") as f:
      digest.update(f.read())
    digest.update(b"\0")
  return digest.hexdigest()[:10]


@functools.lru_cache(maxsize=None)
def this_code_version() -> str:
  """`code_version()` of this checkout, computed once per process."""
  return code_version()


def config_hash(value: Any) -> str:
  """A short stable hash of a JSON-able value (output_dir and name excluded)."""
  if isinstance(value, Mapping):
    value = {k: v for k, v in value.items() if k not in ("output_dir", "name")}
  text = json.dumps(value, sort_keys=True, default=str)
  return hashlib.sha1(text.encode()).hexdigest()[:10]


def unit_hash(value: Any) -> str:
  """`config_hash` of what a unit runs, together with the code that runs it."""
  if isinstance(value, Mapping):
    value = {k: v for k, v in value.items() if k not in ("output_dir", "name")}
  return config_hash({"unit": value, "code": this_code_version()})


class Cache:
  """JSON results of completed units under `<out>/cache/`."""

  def __init__(self, out_dir: str):
    self.root = os.path.join(os.path.abspath(out_dir), CACHE_DIR)
    os.makedirs(self.root, exist_ok=True)

  def path(self, key: str) -> str:
    return os.path.join(self.root, "units", key + ".json")

  def run_dir(self, key: str, digest: str) -> str:
    return os.path.join(self.root, "runs", f"{key}-{digest}")

  def get(self, key: str, digest: str) -> Optional[dict]:
    try:
      with open(self.path(key)) as f:
        stored = json.load(f)
    except (OSError, ValueError):
      return None
    if stored.get("hash") != digest:
      return None
    return stored.get("result")

  def put(self, key: str, digest: str, result: Any) -> None:
    atomic_write_json(self.path(key), {"key": key, "hash": digest, "result": result,
                                       "written": time.strftime("%Y-%m-%d %H:%M:%S")})


# ---------------------------------------------------------------------------- workers


def _init_worker(log_dir: str) -> None:
  """Runs in each spawned worker, before TensorFlow is imported there: quiet
  TensorFlow, no GPU, stderr to a log file. The environment it edits is the
  worker's own; the parent's is never changed."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  os.environ["CUDA_VISIBLE_DEVICES"] = ""
  os.makedirs(log_dir, exist_ok=True)
  log = open(os.path.join(log_dir, f"worker-{os.getpid()}.log"), "a", buffering=1)
  os.dup2(log.fileno(), 2)
  sys.stderr = log
  import logging

  logging.getLogger("tensorflow").setLevel(logging.ERROR)
  # Imported once per worker, so that no unit's time includes it.
  import tensorflow_federated  # noqa: F401
  import tff_fedadamom.pipeline  # noqa: F401


def run_experiment_unit(config: Mapping[str, Any]) -> dict:
  """One experiment in this process; returns what the report needs from it."""
  from tff_fedadamom.pipeline import outputs, run_experiment

  started = time.perf_counter()
  result = run_experiment(dict(config), progress=False)
  summary = result.summary
  rows = outputs.read_metrics(result.output_dir)
  elapsed = [float(r["time/elapsed_s"]) for r in rows if "time/elapsed_s" in r]
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
      "eval_rounds": [int(r["round"]) for r in rows if TEST_ACCURACY in r],
  }
  return record


def calibration_unit(config: Mapping[str, Any], output_dir: str, warm_up: bool = True) -> dict:
  """`run_experiment_unit` after a 2-round warm-up run in the same process, so that
  the measured run pays only what every later run in a worker pays."""
  if warm_up:
    warm = dict(config, rounds=2, eval_every=2, checkpoint_every=2,
                output_dir=output_dir + "-warmup", name="warmup")
    run_experiment_unit(warm)
  return run_experiment_unit(dict(config, output_dir=output_dir))


def call_unit(fn_path: str, kwargs: Mapping[str, Any]) -> Any:
  """Calls `module:function` with `kwargs` (for non-experiment units)."""
  import importlib

  module, name = fn_path.split(":")
  return getattr(importlib.import_module(module), name)(**kwargs)


class Pool:
  """A lazily started pool of spawned workers, shared by every study."""

  def __init__(self, workers: int, log_dir: str):
    self.workers = workers
    self.log_dir = log_dir
    self._executor: Optional[futures.ProcessPoolExecutor] = None

  def executor(self) -> futures.ProcessPoolExecutor:
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


class Unit:
  """One unit of work: an experiment config, or a function with keyword args."""

  def __init__(self, key: str, *, config: Optional[dict] = None,
               fn: Optional[str] = None, kwargs: Optional[dict] = None,
               hash_of: Any = None):
    self.key = key
    self.config = config
    self.fn = fn
    self.kwargs = kwargs or {}
    self.digest = unit_hash(hash_of if hash_of is not None else
                            (config if config is not None else {"fn": fn, **self.kwargs}))


def run_units(units: Sequence[Unit], cache: Cache, pool: Pool, *,
              log: Callable[[str], None] = print, label: str = "",
              execute: bool = True) -> dict:
  """Runs every unit not in the cache (in parallel), caching each as it completes.

  Returns {key: result} for all units. A unit that raises is logged and left out:
  its result is missing, the studies' summaries count the seeds they got, the
  report marks every cell with fewer seeds than planned, and `reproduce` exits
  non-zero; a rerun tries the unit again. With `execute=False` only the cached
  results are returned.
  """
  results: dict[str, Any] = {}
  todo = []
  for unit in units:
    cached = cache.get(unit.key, unit.digest)
    if cached is not None:
      results[unit.key] = cached
    else:
      todo.append(unit)
  if not execute:
    if todo:
      log(f"  {label}: {len(todo)} of {len(units)} units not run yet")
    return results
  if not todo:
    if units:
      log(f"  {label}: all {len(units)} units cached")
    return results
  log(f"  {label}: {len(todo)} of {len(units)} units to run "
      f"({len(units) - len(todo)} cached)")
  executor = pool.executor()
  pending = {}
  for unit in todo:
    if unit.config is not None:
      config = dict(unit.config)
      config["output_dir"] = cache.run_dir(unit.key, unit.digest)
      config["name"] = unit.key
      future = executor.submit(run_experiment_unit, config)
    else:
      future = executor.submit(call_unit, unit.fn, unit.kwargs)
    pending[future] = unit
  started = time.perf_counter()
  done = 0
  for future in futures.as_completed(pending):
    unit = pending[future]
    done += 1
    try:
      result = future.result()
    except Exception as e:  # noqa: BLE001 - reported, the rest continues
      log(f"    [{done}/{len(todo)}] {unit.key}: FAILED: {type(e).__name__}: "
          f"{str(e).splitlines()[0] if str(e) else ''}")
      continue
    cache.put(unit.key, unit.digest, result)
    results[unit.key] = result
    extra = ""
    if isinstance(result, Mapping) and "final_test_accuracy" in result:
      acc = result.get("final_test_accuracy")
      extra = (f" final acc {acc:.4f}" if isinstance(acc, (int, float)) else "") + \
          f" ({result.get('status')}, {result.get('total_s', 0):.0f}s)"
    log(f"    [{done}/{len(todo)}] {unit.key}{extra}; "
        f"{time.perf_counter() - started:.0f}s elapsed")
  return results
