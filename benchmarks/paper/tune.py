"""Equal-budget tuning of every method of the comparison (`plan.OPTIMIZERS`).

Two backends run the same sweep (same space, same trials and rounds for every
optimizer, same seed):

* `ray` - the project's sweep layer (`tuning.run_sweep` / `export_sweep`): one Ray
  Tune experiment for all optimizers, random search, no early stopping, trials in
  the sweep's long-lived workers running `run_experiment`.
* `inprocess` - the same sweep without Ray: the same trials
  (`tuning.space.sample_trials`: seeded per dimension, so optimizers that share
  a dimension get the same draws), run in this package's worker pool.

Either way the best trial is chosen by `tuning.best.choose_best`: the best by the
sweep's metric (test accuracy averaged over the last `last_k` evaluations, in the
sweep's `mode`) among the trials that did not diverge and ran the whole budget,
and its experiment is built by `tuning.export.best_config_dict`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping, Optional, Sequence

from tff_fedadamom.metric_names import TEST_ACCURACY

from benchmarks.paper import runs as runs_lib

LAST_K = 3


def sweep_dict(name: str, base: Mapping[str, Any], optimizers: Sequence[str], trials: int,
               rounds: int, space: Mapping[str, Any], seed: int, workers: int,
               storage_path: str) -> dict:
  """A sweep file's content (tuning/ schema) for `base`."""
  from tuning.schema import num_evaluations

  evals = num_evaluations(rounds, base["eval_every"])
  return {
      "name": name,
      "base": dict(base),
      "optimizers": list(optimizers),
      "budget": {"trials_per_optimizer": trials, "rounds": rounds},
      "space": dict(space),
      "search": {"kind": "random", "seed": seed},
      "scheduler": {"kind": "none"},
      "metric": {"name": TEST_ACCURACY, "last_k": min(LAST_K, evals), "mode": "max"},
      "resources": {"cpus_per_trial": 1, "gpus_per_trial": 0,
                    "max_concurrent_trials": workers, "time_budget_s": None,
                    "address": None, "storage_path": storage_path, "max_failures": 1},
  }


def _tune_inprocess(sweep, raw: Mapping, cache, pool, log) -> dict:
  from tuning import space as space_lib
  from tuning import trainable as trainable_lib
  from tuning.best import choose_best

  units, meta = [], {}
  for optimizer in sweep.optimizers:
    space = space_lib.resolve(sweep, optimizer)
    for trial, params in enumerate(space_lib.sample_trials(sweep, optimizer)):
      config = space_lib.experiment_dict(sweep, optimizer, params, output_dir="unused",
                                         threads=1, space=space)
      key = f"tune/{sweep.name}/{optimizer}/trial{trial}"
      units.append(runs_lib.Unit(key, config=config))
      meta[key] = (optimizer, params)
  results = runs_lib.run_units(units, cache, pool, log=log, label=f"tuning {sweep.name}")
  best: dict[str, Any] = {}
  for optimizer in sweep.optimizers:
    trials = []
    for key, (opt, params) in meta.items():
      if opt != optimizer or key not in results:
        continue
      r = results[key]
      objective = trainable_lib.objective_from_history(
          r["history"] or [], sweep.metric.name, sweep.metric.last_k)
      diverged = (r["status"] != "completed" or objective is None
                  or not math.isfinite(objective))
      trials.append({"params": params, "objective": objective, "diverged": diverged,
                     "rounds": r.get("rounds_completed")})
    chosen, _ = choose_best(
        trials, mode=sweep.metric.mode, rounds=sweep.budget.rounds, complete_only=True,
        fields=lambda t: (t["objective"], t["rounds"] or 0, t["diverged"]))
    best[optimizer] = {
        "params": chosen["params"] if chosen else None,
        "objective": chosen["objective"] if chosen else None,
        "trials_run": len(trials), "trials_diverged": sum(t["diverged"] for t in trials),
        "trials": trials,
    }
  return best


def _tune_ray(sweep, raw: Mapping, log) -> dict:
  from tuning import run_sweep
  from tuning.sweep import SWEEP_FILE

  resume = os.path.exists(os.path.join(sweep.sweep_dir, SWEEP_FILE))
  log(f"  tuning {sweep.name}: Ray Tune sweep in {sweep.sweep_dir}"
      + (" (resuming)" if resume else ""))
  result = run_sweep(sweep, resume=resume, progress_interval_s=120.0)
  if result.interrupted:
    raise KeyboardInterrupt(f"sweep {sweep.name} was interrupted")
  export = result.export
  rows = {row["optimizer"]: row for row in export.rows}
  records = _trial_records(sweep.sweep_dir, sweep.optimizers)
  best = {}
  for optimizer in sweep.optimizers:
    chosen = export.best.get(optimizer)
    row = rows.get(optimizer, {})
    trials = []
    for record in records.get(optimizer, []):
      trials.append({"params": dict(record.params), "objective": record.objective,
                     "diverged": record.diverged, "rounds": record.rounds})
    best[optimizer] = {
        "params": dict(chosen.trial.params) if chosen else None,
        "objective": chosen.trial.objective if chosen else None,
        "trials_run": row.get("trials_run"), "trials_diverged": row.get("trials_diverged"),
        "trials": trials,
    }
  return best


def _trial_records(sweep_dir: str, optimizers: Sequence[str]) -> dict:
  """Optimizer -> its trial records, read once for the whole sweep."""
  from tuning.export import read_sweep_trials

  try:
    return read_sweep_trials(sweep_dir, optimizers)
  except Exception:  # noqa: BLE001 - the trial list is informative only
    return {}


def tune(name: str, base: Mapping[str, Any], optimizers: Sequence[str], *, trials: int,
         rounds: int, space: Mapping[str, Any], seed: int, backend: str, cache, pool,
         log: Callable[[str], None] = print, execute: bool = True) -> Optional[dict]:
  """Tunes every optimizer with the same budget; returns, per optimizer, the best
  params, its objective, the trial list and the best trial's experiment config.

  Cached as unit `tune/<name>`: a rerun with the same sweep and backend reuses it.
  With `execute=False`, returns the cached outcome or None.
  """
  from tuning import load_sweep
  from tuning.export import best_config_dict

  storage = os.path.join(cache.root, "sweeps")
  raw = sweep_dict(name, base, optimizers, trials, rounds, space, seed, pool.workers,
                   storage)
  digest = runs_lib.unit_hash({"sweep": {k: v for k, v in raw.items()
                                           if k not in ("resources", "name")},
                                 "backend": backend})
  raw["name"] = f"{name}-{digest}"
  key = f"tune/{name}"
  cached = cache.get(key, digest)
  if cached is not None:
    log(f"  tuning {name}: cached ({backend})")
    return cached
  if not execute:
    log(f"  tuning {name}: not run yet")
    return None
  sweep = load_sweep(raw)
  if backend == "ray":
    pool.shutdown()  # give Ray the CPUs
    best = _tune_ray(sweep, raw, log)
  elif backend == "inprocess":
    best = _tune_inprocess(sweep, raw, cache, pool, log)
  else:
    raise ValueError(f"unknown tuning backend {backend!r}; use 'ray' or 'inprocess'")
  for optimizer, entry in best.items():
    params = entry["params"] or {}
    entry["config"] = best_config_dict(sweep, optimizer, params)
    entry["fallback_defaults"] = entry["params"] is None
  out = {"backend": backend, "sweep_name": sweep.name,
         "budget": {"trials_per_optimizer": trials, "rounds": rounds},
         "metric": raw["metric"], "seed": seed, "space": raw["space"], "best": best}
  expected = trials * len(optimizers)
  ran = sum(int(e.get("trials_run") or 0) for e in best.values())
  if ran >= expected:
    cache.put(key, digest, out)
  else:
    log(f"  tuning {name}: only {ran} of {expected} trials finished; not cached")
  return out
