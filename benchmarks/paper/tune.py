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
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from tff_fedadamom.metric_names import TEST_ACCURACY

from benchmarks.paper import units as units_lib

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


def trial_units(sweep, name: str) -> list:
  """One unit per trial of every optimizer: `tune/<name>/<optimizer>/trial<i>`,
  with the parameters it samples (`tuning.space.sample_trials`)."""
  from tuning import space as space_lib

  out = []
  for optimizer in sweep.optimizers:
    space = space_lib.resolve(sweep, optimizer)
    for trial, params in enumerate(space_lib.sample_trials(sweep, optimizer)):
      config = space_lib.experiment_dict(sweep, optimizer, params, output_dir="unused",
                                         threads=1, space=space)
      out.append((units_lib.Unit(f"tune/{name}/{optimizer}/trial{trial}", config=config),
                  optimizer, params))
  return out


def _outcomes(sweep, planned: Sequence, results: Mapping) -> dict:
  """Per optimizer: the best of its completed trials (`tuning.best.choose_best`)."""
  from tuning import trainable as trainable_lib
  from tuning.best import choose_best

  best: dict[str, Any] = {}
  for optimizer in sweep.optimizers:
    trials = []
    for unit, opt, params in planned:
      if opt != optimizer or unit.name not in results:
        continue
      r = results[unit.name]
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


def _tune_ray(sweep, log) -> dict:
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


def tune(ctx, requests: Mapping[str, Mapping[str, Any]], seed: int,
         alongside: Sequence = ()) -> dict:
  """Tunes each base's optimizers with the same budget on each requested base; returns
  {name: outcome or None}, an outcome holding, per optimizer, the best params,
  its objective, the trial list and the best trial's experiment config.

  `requests` maps a sweep name to its `base`, `optimizers`, `trials`, `rounds`
  and `space`; its order is the order trials are submitted in (the costliest
  first, so that the pool's last minutes are not one long trial).
  In process, every trial of every sweep is a unit of `ctx.store`, all run as
  one batch (stored, and committed with --commit-units, as each completes; a
  rerun runs only the trials not stored). Through Ray, each sweep is one entry
  of the local cache (Tune resumes its own interrupted sweep on the same
  machine). With `ctx.execute` False, nothing runs: the outcome of the stored
  trials, or None for a sweep without any.

  `alongside`: units that do not depend on tuning (the escape simulation), run
  in process in the same batch, submitted first, and stored as they complete,
  so that they fill the pool while the trials run instead of running after
  them. Through Ray they are left to the caller's next batch.
  """
  from tuning import load_sweep

  sweeps = {}
  for name, r in requests.items():
    raw = sweep_dict(name, r["base"], r["optimizers"], r["trials"], r["rounds"], r["space"], seed,
                     ctx.pool.workers, os.path.join(ctx.cache.root, "sweeps"))
    spec = {k: v for k, v in raw.items() if k not in ("resources", "name")}
    raw["name"] = f"{name}-{units_lib.spec_hash(spec)}"
    sweeps[name] = (load_sweep(raw), raw, spec)
  if ctx.backend == "ray":
    bests = {name: _tune_ray_cached(ctx, sweep, name, spec)
             for name, (sweep, _, spec) in sweeps.items()}
  elif ctx.backend == "inprocess":
    planned = {name: trial_units(sweep, name) for name, (sweep, _, _) in sweeps.items()}
    results = ctx.run(list(alongside) + [u for trials in planned.values() for u, _, _ in trials],
                      "tuning " + ", ".join(sweeps)
                      + "".join(f" (and {u.name})" for u in alongside))
    bests = {name: _outcomes(sweeps[name][0], trials, results)
             if any(u.name in results for u, _, _ in trials) else None
             for name, trials in planned.items()}
  else:
    raise ValueError(f"tuner: unknown backend {ctx.backend!r}; use 'ray' or 'inprocess'")
  return {name: _outcome(ctx, sweep, raw, bests[name], seed)
          for name, (sweep, raw, _) in sweeps.items()}


def _outcome(ctx, sweep, raw: Mapping, best: Optional[dict], seed: int) -> Optional[dict]:
  """The tuning outcome of one sweep from its per-optimizer bests."""
  from tuning.export import best_config_dict

  if best is None:
    ctx.log(f"  tuning {raw['name']}: not run yet")
    return None
  for optimizer, entry in best.items():
    entry["config"] = best_config_dict(sweep, optimizer, entry["params"] or {})
    entry["fallback_defaults"] = entry["params"] is None
  return {"backend": ctx.backend, "sweep_name": sweep.name,
          "budget": dict(raw["budget"]), "metric": raw["metric"], "seed": seed,
          "space": raw["space"], "best": best}


def _tune_ray_cached(ctx, sweep, name: str, sweep_spec: Mapping) -> Optional[dict]:
  """The Ray sweep's per-optimizer outcome, from the local cache or run now."""
  unit = units_lib.Unit(f"tune/{name}", fn="ray-sweep", kwargs={"sweep": dict(sweep_spec)},
                        methods=sweep.optimizers)
  store = ctx.cache.store()
  cached = store.get(unit)
  if cached is not None or not ctx.execute:
    return cached
  ctx.pool.shutdown()  # give Ray the CPUs
  started = time.perf_counter()
  best = _tune_ray(sweep, ctx.log)
  expected = sweep.budget.trials_per_optimizer * len(sweep.optimizers)
  ran = sum(int(e.get("trials_run") or 0) for e in best.values())
  if ran >= expected:
    store.put(unit, best, time.perf_counter() - started)
  else:
    ctx.log(f"  tuning {name}: only {ran} of {expected} trials finished; not cached")
  return best
