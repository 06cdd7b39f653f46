"""Equal-budget tuning of every method of a comparison, every trial a unit.

A method's space merges, later winning: the registry's search ranges of its hparams, the
client learning rate's default range, the plan's shared entries, the plan's entries for the
method; a `server.<hparam>` entry applies only to the methods that have that hparam (a range
to those that may tune it).

Trial i takes in each dimension the i-th draw of that dimension's own generator, seeded by
`tuning.space.dimension_seed`: common random numbers, as in the sweeps. Draws are as
Ray Tune's domains make them, exp(U(log a, log b)) and U(a, b): the stored trials were drawn
that way.

A method's best trial has the best mean `METRIC` over its last `LAST_K` evaluations among
those that completed the rounds without diverging (the first of equal ones); without one,
its final runs take the registry's defaults.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Mapping, Sequence

import numpy as np

from tff_fedadamom.metric_names import ROUND, VALIDATION_ACCURACY, evaluated
from tuning.space import dimension_seed

from benchmarks.paper import units as units_lib

LAST_K = 3
# Tuning selects on the examples held out from the training clients, never the test set.
METRIC = VALIDATION_ACCURACY
BACKEND = "inprocess"
# The client learning rate's default range (Reddi et al. 2021, grid 1e-3..1e1).
CLIENT_LR = {"dist": "loguniform", "low": 1e-3, "high": 10.0}


def _is_dimension(entry: Any) -> bool:
  return isinstance(entry, Mapping) and "dist" in entry


def method_space(optimizer: str, space: Mapping[str, Any]) -> tuple:
  """(tuned, fixed) of `optimizer`: dotted path -> distribution, and -> value."""
  from tff_fedadamom.methods import default_hparams, search_ranges, sweepable_hparams

  sweepable, known = set(sweepable_hparams(optimizer)), set(default_hparams(optimizer))
  registry = {f"server.{h}": {"dist": d, "low": lo, "high": hi}
              for h, (d, lo, hi) in search_ranges(optimizer).items()}
  shared = {k: v for k, v in space.items() if "." in k}
  merged: dict[str, Any] = {}
  for entries in (registry, {"client.learning_rate": CLIENT_LR}, shared,
                  space.get(optimizer, {})):
    for path, entry in entries.items():
      if path.startswith("server.") and path[7:] not in (
          sweepable if _is_dimension(entry) else known):
        continue
      merged[path] = entry
  tuned = {p: e for p, e in merged.items() if _is_dimension(e)}
  return tuned, {p: e for p, e in merged.items() if not _is_dimension(e)}


def draws(tuned: Mapping[str, Mapping], trials: int, seed: int) -> list:
  columns = {}
  for path, dist in tuned.items():
    rng = np.random.RandomState(dimension_seed(seed, path))
    if dist["dist"] == "loguniform":
      draw = lambda: np.exp(rng.uniform(np.log(dist["low"]), np.log(dist["high"]), size=1))
    elif dist["dist"] == "uniform":
      draw = lambda: rng.uniform(dist["low"], dist["high"], size=1)
    else:
      raise ValueError(f"search space {path}: dist {dist['dist']!r}; allowed: loguniform, "
                       "uniform")
    columns[path] = [float(draw()[0]) for _ in range(trials)]
  return [{path: values[i] for path, values in columns.items()} for i in range(trials)]


def trial_config(base: Mapping, optimizer: str, rounds: int, values: Mapping) -> dict:
  """The resolved base run with `optimizer` for `rounds`, `values` (dotted path ->
  value) replacing its registry defaults."""
  from tff_fedadamom.experiment.compare import with_optimizer

  tree = with_optimizer(copy.deepcopy(dict(base)), optimizer)
  tree.update(rounds=rounds, output_dir="unused", name=None)
  for path, value in values.items():
    section, _, key = path.rpartition(".")
    tree[section][key] = value
  tree["runtime"]["threads"] = 1
  return tree


def objective(history: Sequence[Mapping], last_k: int) -> float:
  """`tuning.trainable.objective_from_history` of `METRIC`, without importing Ray."""
  rows = {int(r[ROUND]): r for r in history if evaluated(r) and METRIC in r}
  values = [float(rows[k][METRIC]) for k in sorted(rows)][-last_k:]
  if not values:
    return None
  return sum(values) / len(values) if all(math.isfinite(v) for v in values) else math.nan


def plan_sweep(name: str, request: Mapping, seed: int) -> dict:
  """The trials (units `tune/<name>/<optimizer>/trial<i>`) of one comparison's
  tuning; `request` holds its base, optimizers, trials, rounds and space."""
  from tff_fedadamom.config import config_to_dict, load_config

  base, rounds = config_to_dict(load_config(dict(request["base"]))), request["rounds"]
  evals = rounds // base["eval_every"] + (1 if rounds % base["eval_every"] else 0)
  sweep = {"name": name, "rounds": rounds, "metric": {
      "name": METRIC, "last_k": min(LAST_K, evals), "mode": "max"},
           "space": request["space"], "seed": seed, "base": base, "methods": {}}
  for optimizer in request["optimizers"]:
    tuned, fixed = method_space(optimizer, request["space"])
    trials = [(params, units_lib.Unit(f"tune/{name}/{optimizer}/trial{i}", config=trial_config(
        base, optimizer, rounds, {**fixed, **params})))
              for i, params in enumerate(draws(tuned, request["trials"], seed))]
    sweep["methods"][optimizer] = {"fixed": fixed, "trials": trials}
  return sweep


def outcome(sweep: Mapping, results: Mapping) -> dict:
  """A sweep's outcome from the stored trials: per method its best trial's params,
  objective and config, and the trial list."""
  best = {}
  for optimizer, planned in sweep["methods"].items():
    trials, chosen = [], None
    for params, unit in planned["trials"]:
      if unit.name not in results:
        continue
      r = results[unit.name]
      value = objective(r["history"] or [], sweep["metric"]["last_k"])
      diverged = r["status"] != "completed" or value is None or not math.isfinite(value)
      trial = {"params": params, "objective": value, "diverged": diverged,
               "rounds": r.get("rounds_completed"), "final": r.get("final_test_accuracy")}
      trials.append(trial)
      if not diverged and (trial["rounds"] or 0) >= sweep["rounds"] and (
          chosen is None or value > chosen[0]["objective"]):
        chosen = (trial, unit)
    best_trial, best_unit = chosen or ({"params": None, "objective": None}, None)
    best[optimizer] = {
        "params": best_trial["params"], "objective": best_trial["objective"],
        "trials_run": len(trials), "trials_diverged": sum(t["diverged"] for t in trials),
        "trials": trials, "fallback_defaults": chosen is None,
        "config": copy.deepcopy(best_unit.config if best_unit else trial_config(
            sweep["base"], optimizer, sweep["rounds"], planned["fixed"]))}
  return {"backend": BACKEND, "metric": sweep["metric"], "seed": sweep["seed"],
          "space": sweep["space"], "best": best}


def tune(ctx, requests: Mapping[str, Mapping[str, Any]], seed: int,
         alongside: Sequence = ()) -> dict:
  """{name: outcome, or None without a stored trial} of each requested comparison,
  all trials one batch in `requests`' order (the costliest first, so the pool's
  last minutes are not one long trial). `alongside`: units that need no tuning,
  submitted first so that they fill the pool beside the trials."""
  sweeps = {name: plan_sweep(name, r, seed) for name, r in requests.items()}
  trials = [u for s in sweeps.values() for m in s["methods"].values() for _, u in m["trials"]]
  results = ctx.run(list(alongside) + trials, "tuning " + ", ".join(sweeps)
                    + "".join(f" (and {u.name})" for u in alongside))
  out = {}
  for name, sweep in sweeps.items():
    names = [u.name for m in sweep["methods"].values() for _, u in m["trials"]]
    out[name] = outcome(sweep, results) if any(n in results for n in names) else None
    if out[name] is None:
      ctx.log(f"  tuning {name}: not run yet")
  return out
