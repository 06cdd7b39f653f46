"""The five studies: which units each runs, and the numbers each hands to the report.

Every function returns plain JSON-able data (also written to results.json).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from tff_fedadamom.metric_names import ROUND, TEST_ACCURACY

from benchmarks.paper import escape
from benchmarks.paper import escape_fit
from benchmarks.paper import plan
from benchmarks.paper import runs as runs_lib
from benchmarks.paper import tune as tune_lib
from benchmarks.paper import units as units_lib


class Context:
  """What every study needs: budget, unit store, local cache, pool, tuning
  backend, log, and the units already planned (identical experiments share one
  name and one run)."""

  def __init__(self, budget: plan.Budget, store: units_lib.Store, cache: runs_lib.Cache,
               pool: runs_lib.Pool, backend: str, log: Callable[[str], None] = print,
               execute: bool = True):
    self.budget, self.store, self.cache, self.pool, self.backend, self.log = (
        budget, store, cache, pool, backend, log)
    self.execute = execute
    self._names: dict[str, str] = {}

  def unit(self, name: str, config: dict) -> units_lib.Unit:
    unit = units_lib.Unit(name, config=config)
    unit.name = self._names.setdefault(units_lib.spec_hash(unit.spec), name)
    return unit

  def run(self, units: Sequence[units_lib.Unit], label: str) -> dict:
    """{name: result} of `units`: stored ones loaded, the others run (see
    runs.run_units)."""
    return runs_lib.run_units(units, self.store, self.cache, self.pool, log=self.log,
                              label=label, execute=self.execute)


# ---------------------------------------------------------------------------- helpers


def sample_std(values: Sequence[float]) -> Optional[float]:
  """The sample standard deviation (ddof = 1), the report's one convention for
  spreads over seeds (tables and curve bands); None for fewer than two values."""
  return float(np.std(values, ddof=1)) if len(values) > 1 else None


def mean_std(values: Sequence[Optional[float]]) -> dict:
  vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
  if not vals:
    return {"mean": None, "std": None, "n": 0}
  return {"mean": float(np.mean(vals)), "std": sample_std(vals), "n": len(vals)}


def seed_summary(records: Sequence[Mapping], target: float) -> dict:
  """Mean +- std over seeds of final/best accuracy; rounds to `target`."""
  finals = [r.get("final_test_accuracy") for r in records]
  bests = [r.get("best_test_accuracy") for r in records]
  key = f"{target:g}"
  reached = [r["rounds_to_target"].get(key) for r in records
             if r.get("rounds_to_target") and r["rounds_to_target"].get(key) is not None]
  return {
      "final": mean_std(finals), "best": mean_std(bests),
      "rounds_to_target": mean_std(reached), "reached": len(reached), "seeds": len(records),
      "diverged": sum(r.get("status") != "completed" for r in records),
      "final_by_seed": {str(r.get("seed")): r.get("final_test_accuracy") for r in records},
  }


def mean_curve(records: Sequence[Mapping]) -> dict:
  """Test accuracy per evaluated round: mean, sample std (None with one value) and
  number of seeds over seeds."""
  by_round: dict[int, list] = {}
  for r in records:
    for row in r.get("history") or []:
      acc = row.get(TEST_ACCURACY)
      if acc is not None and math.isfinite(acc):
        by_round.setdefault(int(row[ROUND]), []).append(float(acc))
  rounds = sorted(by_round)
  return {"round": rounds, "mean": [float(np.mean(by_round[k])) for k in rounds],
          "std": [sample_std(by_round[k]) for k in rounds],
          "n": [len(by_round[k]) for k in rounds]}


def _final_config(tuned_config: Mapping, *, seed: int, rounds: int, base: Mapping) -> dict:
  config = copy.deepcopy(dict(tuned_config))
  config.update(seed=seed, rounds=rounds, eval_every=base["eval_every"],
                checkpoint_every=base["checkpoint_every"], targets=list(base["targets"]),
                telemetry=False)
  # One thread; the rest of the runtime section stays the tuned trial's, so a
  # final run with the trial's seed and rounds is the trial's unit.
  config.setdefault("runtime", {})["threads"] = 1
  return config


def _hparams(entry: Mapping) -> dict:
  config = entry["config"]
  out = {"client.learning_rate": config["client"]["learning_rate"]}
  for k, v in config["server"].items():
    if k not in ("optimizer", "client_weighting", "schedule"):
      out[f"server.{k}"] = v
  return out


# ---------------------------------------------------------------------------- studies 1, 2


def compare(ctx: Context, requests: Mapping[str, tuple], alongside: Sequence = ()) -> dict:
  """Equal-budget tuning of each base's methods on each base of `requests` (name
  -> (base, data budget, client learning-rate range, methods)), all trials in one
  batch, with the units `alongside` (`tune.tune`). Returns {name: {"tuning":
  outcome, "base": base}} for the sweeps that ran; an outcome's "best" holds one
  entry per method, in `methods`' order."""
  tuned = tune_lib.tune(ctx, {
      name: {"base": base, "trials": db.tune_trials, "rounds": db.tune_rounds,
             "space": plan.search_space(client_lr, methods), "optimizers": methods}
      for name, (base, db, client_lr, methods) in requests.items()},
      seed=ctx.budget.tune_seed, alongside=alongside)
  return {name: {"tuning": outcome, "base": requests[name][0]}
          for name, outcome in tuned.items() if outcome is not None}


def finals_units(ctx: Context, name: str, comparison: Mapping,
                 data_budget: plan.DataBudget) -> list:
  units = []
  for opt, entry in comparison["tuning"]["best"].items():
    for seed in data_budget.seeds:
      config = _final_config(entry["config"], seed=seed, rounds=data_budget.rounds,
                             base=comparison["base"])
      units.append(ctx.unit(f"{name}/{opt}/seed{seed}", config))
  return units


def summarize_comparison(name: str, comparison: Mapping, data_budget: plan.DataBudget,
                         results: Mapping, units: Sequence) -> dict:
  by_opt: dict[str, list] = {o: [] for o in comparison["tuning"]["best"]}
  for unit in units:
    opt = unit.config["server"]["optimizer"]
    if unit.name in results:
      by_opt[opt].append(results[unit.name])
  table = {}
  for opt, records in by_opt.items():
    entry = comparison["tuning"]["best"][opt]
    table[opt] = {
        **seed_summary(records, data_budget.target),
        "curve": mean_curve(records),
        "hparams": _hparams(entry),
        "tune_objective": entry.get("objective"),
        "trials_run": entry.get("trials_run"),
        "trials_diverged": entry.get("trials_diverged"),
        "fallback_defaults": entry.get("fallback_defaults", False),
    }
  base = comparison["base"]
  return {
      "name": name, "table": table, "target": data_budget.target,
      "setup": {
          "data": base["data"], "model": base["model"],
          "clients_per_round": base["clients_per_round"],
          "client": {k: v for k, v in base["client"].items() if k != "learning_rate"},
          "rounds": data_budget.rounds, "eval_every": base["eval_every"],
          "methods": list(by_opt),
          "seeds": list(data_budget.seeds), "tune_trials": data_budget.tune_trials,
          "tune_rounds": data_budget.tune_rounds,
          "tune_backend": comparison["tuning"]["backend"],
          "tune_seed": comparison["tuning"]["seed"],
          "tune_metric": comparison["tuning"]["metric"],
          "space": comparison["tuning"]["space"],
      },
  }


# ---------------------------------------------------------------------------- study 3


def beta2_units(ctx: Context, fmnist: Mapping) -> list:
  b = ctx.budget
  units = []
  for part, comparison in fmnist.items():
    entry = comparison["tuning"]["best"]["fedadamom"]
    for beta2 in b.beta2_grid:
      for seed in b.beta2_seeds:
        config = _final_config(entry["config"], seed=seed, rounds=b.fmnist.rounds,
                               base=comparison["base"])
        config["server"]["beta_2"] = beta2
        units.append(ctx.unit(f"beta2/{part}/b{beta2:g}/seed{seed}", config))
  return units


def summarize_beta2(ctx: Context, fmnist: Mapping, results: Mapping, units) -> dict:
  b = ctx.budget
  table: dict[str, dict] = {}
  for part in fmnist:
    table[part] = {}
    for beta2 in b.beta2_grid:
      records = [results[u.name] for u in units
                 if u.config["data"]["partition"] == plan.PARTITIONS[part]
                 and u.config["server"]["beta_2"] == beta2 and u.name in results]
      table[part][f"{beta2:g}"] = seed_summary(records, b.fmnist.target)
  fixed = {part: {k: v for k, v in _hparams(c["tuning"]["best"]["fedadamom"]).items()
                  if k != "server.beta_2"} for part, c in fmnist.items()}
  return {"table": table, "seeds": list(b.beta2_seeds), "rounds": b.fmnist.rounds,
          "fixed_hparams": fixed}


# ---------------------------------------------------------------------------- study 5


def hetero_units(ctx: Context, fmnist: Mapping) -> list:
  b = ctx.budget
  comparison = fmnist["dir0.3"]
  units = []
  for label, partition in b.heterogeneity_items():
    for opt in ("fedadam", "fedadamom"):
      entry = comparison["tuning"]["best"][opt]
      for seed in b.hetero_seeds:
        config = _final_config(entry["config"], seed=seed, rounds=b.fmnist.rounds,
                               base=comparison["base"])
        config["data"]["partition"] = dict(partition)
        units.append(ctx.unit(f"hetero/a{label}/{opt}/seed{seed}", config))
  return units


def summarize_hetero(ctx: Context, results: Mapping, units) -> dict:
  b = ctx.budget
  rows = []
  for label, partition in b.heterogeneity_items():
    per_opt = {}
    for opt in ("fedadam", "fedadamom"):
      per_opt[opt] = {str(u.config["seed"]): results[u.name] for u in units
                      if u.name in results and u.config["server"]["optimizer"] == opt
                      and u.config["data"]["partition"] == partition}
    seeds = sorted(set(per_opt["fedadam"]) & set(per_opt["fedadamom"]))
    diffs = [per_opt["fedadamom"][s]["final_test_accuracy"]
             - per_opt["fedadam"][s]["final_test_accuracy"] for s in seeds
             if per_opt["fedadamom"][s].get("final_test_accuracy") is not None
             and per_opt["fedadam"][s].get("final_test_accuracy") is not None]
    rows.append({
        "alpha": label,
        "fedadam": seed_summary(list(per_opt["fedadam"].values()), b.fmnist.target),
        "fedadamom": seed_summary(list(per_opt["fedadamom"].values()), b.fmnist.target),
        "difference": mean_std(diffs), "paired_seeds": seeds,
    })
  return {"rows": rows, "seeds": list(b.hetero_seeds), "rounds": b.fmnist.rounds}


# ---------------------------------------------------------------------------- study 4


def escape_unit(ctx: Context) -> units_lib.Unit:
  setup = dataclasses.asdict(ctx.budget.escape)
  return units_lib.Unit("escape/study", fn="benchmarks.paper.escape:run_study_dict",
                        kwargs={"setup": setup}, methods=escape.OPTIMIZERS,
                        version=escape.VERSION)


def summarize_escape(raw: Mapping, bootstrap: int) -> dict:
  return {"raw": {k: v for k, v in raw.items() if k != "optimizers"},
          "per_optimizer": {
              name: {"lr": res["lr"], "per_k": res["per_k"],
                     "rounds_simulated": res["rounds_simulated"],
                     "seconds": res["seconds"]}
              for name, res in raw["optimizers"].items()},
          "analysis": escape_fit.analyse(raw, bootstrap=bootstrap)}
