"""The six studies: which units each runs, and the JSON-able summaries of results.json.

Spreads over seeds are sample standard deviations (ddof = 1). A completed run at
most `plan.FAILED_MARGIN` above `chance_accuracy` is *failed* (README.md).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from tff_fedadamom.metric_names import DROPPED, MAX_STALENESS, MEAN_STALENESS, ROUND, TEST_ACCURACY

from benchmarks.paper import escape, plan
from benchmarks.paper import runs as runs_lib
from benchmarks.paper import units as units_lib

PAIR = ("fedadam", "fedadamom")  # study 5's two methods
_chance_memo: dict = {}  # the data and model sections (JSON) -> chance_accuracy


class Context:
  """What every study needs. Identical experiments share one name and one run;
  `missing`: the units not stored when nothing runs, each with the reason."""

  def __init__(self, budget: plan.Budget, store: units_lib.Store, cache: runs_lib.Cache,
               pool: runs_lib.Pool, log: Callable[[str], None] = print,
               execute: bool = True):
    self.budget, self.store, self.cache, self.pool, self.log = budget, store, cache, pool, log
    self.execute, self.missing, self._names = execute, {}, {}  # _names: spec hash -> name

  def unit(self, name: str, config: dict) -> units_lib.Unit:
    unit = units_lib.Unit(name, config=config)
    unit.name = self._names.setdefault(units_lib.spec_hash(unit.spec), name)
    return unit

  def run(self, units: Sequence[units_lib.Unit], label: str) -> dict:
    results = runs_lib.run_units(units, self.store, self.cache, self.pool, log=self.log,
                                 label=label, execute=self.execute)
    self.missing.update({u.name: self.store.why_missing(u) for u in units
                         if u.name not in results})
    return results


def mean_std(values: Sequence[Optional[float]]) -> dict:
  vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
  return {"mean": float(np.mean(vals)) if vals else None,
          "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else None, "n": len(vals)}


def seed_summary(records: Sequence[Mapping], target: float) -> dict:
  key = f"{target:g}"
  reached = [r["rounds_to_target"][key] for r in records
             if (r.get("rounds_to_target") or {}).get(key) is not None]
  return {**{k: mean_std([r.get(f"{k}_test_accuracy") for r in records])
             for k in ("final", "best")},
          "rounds_to_target": mean_std(reached), "reached": len(reached), "seeds": len(records),
          "diverged": sum(r.get("status") != "completed" for r in records),
          "final_by_seed": {str(r.get("seed")): r.get("final_test_accuracy") for r in records}}


def mean_curve(records: Sequence[Mapping]) -> dict:
  by_round: dict[int, list] = {}
  for r in records:
    for row in r.get("history") or []:
      acc = row.get(TEST_ACCURACY)
      if acc is not None and math.isfinite(acc):
        by_round.setdefault(int(row[ROUND]), []).append(float(acc))
  rounds = sorted(by_round)
  stats = [mean_std(by_round[k]) for k in rounds]
  return {"round": rounds, **{key: [s[key] for s in stats] for key in ("mean", "std", "n")}}


def chance_accuracy(base: Mapping) -> float:
  """The test accuracy of always predicting the most frequent test label of `base`
  (an experiment config), padding positions aside, memoized per data section."""
  from tff_fedadamom.config import load_config
  from tff_fedadamom.experiment.process import load_data
  from tff_fedadamom.models import losses
  from tff_fedadamom.models.registry import get_spec

  key = json.dumps([base["data"], base["model"]["name"]], sort_keys=True, default=str)
  if key not in _chance_memo:
    data = load_data(load_config(dict(base)))
    labels = np.concatenate([np.asarray(batch["y"]).ravel() for batch in
                             data.test.batch(10_000).as_numpy_iterator()]).astype(np.int64)
    if get_spec(base["model"]["name"]).task == "next_char":
      labels = labels[labels != losses.PAD_ID]
    _chance_memo[key] = float(np.bincount(labels).max() / labels.size)
  return _chance_memo[key]


def count_failed(finals: Sequence[tuple], chance: Optional[float]) -> Optional[int]:
  """How many (completed, final test accuracy) pairs failed; None without chance."""
  if chance is None:
    return None
  return sum(done and acc is not None and acc <= chance + plan.FAILED_MARGIN
             for done, acc in finals)


def staleness_summary(records: Sequence[Mapping]) -> Optional[dict]:
  """The staleness asynchronous runs saw over all their server steps; None without."""
  steps = [row for r in records for row in r.get("async_history") or []]
  if not steps:
    return None
  runs = sum(bool(r.get("async_history")) for r in records)
  return {"mean": float(np.mean([row[MEAN_STALENESS] for row in steps])),
          "max": int(max(row[MAX_STALENESS] for row in steps)),
          "dropped_per_run": float(sum(row.get(DROPPED, 0) for row in steps) / runs),
          "runs": runs, "steps": len(steps)}


def _final(ctx: Context, name: str, entry: Mapping, base: Mapping, seed: int,
           rounds: int, **sections) -> units_lib.Unit:
  """The unit of a tuned config run with `seed` for `rounds`, `sections` updating
  its sections; with the trial's seed and rounds, it is the trial's unit."""
  config = copy.deepcopy(dict(entry["config"]))
  config.update(seed=seed, rounds=rounds, eval_every=base["eval_every"],
                checkpoint_every=base["checkpoint_every"], targets=list(base["targets"]),
                telemetry=False)
  config.setdefault("runtime", {})["threads"] = 1
  for section, values in sections.items():
    config[section].update(values)
  return ctx.unit(name, config)


def hparams(entry: Mapping) -> dict:
  """A tuned config's client learning rate and server hparams, to `units.SPEC_DIGITS`."""
  config = entry["config"]
  return units_lib.canonical({
      "client.learning_rate": config["client"]["learning_rate"],
      **{f"server.{k}": v for k, v in config["server"].items()
         if k not in ("optimizer", "client_weighting", "schedule")}})


def summarize_comparison(name: str, comparison: Mapping, budget: plan.DataBudget,
                         results: Mapping, units: Sequence,
                         chance: Optional[float] = None) -> dict:
  """Studies 1, 2 and 6: a table row per method, and the setup the report prints."""
  tuning, base = comparison["tuning"], comparison["base"]
  table, records_of = {}, {}
  for opt, entry in tuning["best"].items():
    records = records_of[opt] = [results[u.name] for u in units
                                 if u.config["server"]["optimizer"] == opt and u.name in results]
    trials = entry.get("trials") or []
    table[opt] = {
        **seed_summary(records, budget.target), "curve": mean_curve(records),
        "failed": count_failed([(r.get("status") == "completed", r.get("final_test_accuracy"))
                                for r in records], chance),
        "hparams": hparams(entry), "tune_objective": entry.get("objective"),
        "trials_run": entry.get("trials_run"), "trials_diverged": entry.get("trials_diverged"),
        "trials_failed": count_failed([(not t["diverged"], t.get("final")) for t in trials],
                                      chance),
        "fallback_defaults": entry.get("fallback_defaults", False),
        "ranges": entry.get("ranges") or {}}
  summary = {"name": name, "table": table, "target": budget.target, "setup": {
      **{k: base.get(k) for k in ("data", "model", "validation", "clients_per_round")},
      "client": {k: v for k, v in base["client"].items() if k != "learning_rate"},
      "rounds": budget.rounds, "eval_every": base["eval_every"], "methods": list(table),
      "seeds": list(budget.seeds), "tune_trials": budget.tune_trials,
      "tune_rounds": budget.tune_rounds, "tune_backend": tuning["backend"],
      "tune_seed": tuning["seed"], "tune_metric": tuning["metric"], "space": tuning["space"],
      "chance_accuracy": chance}}
  if base.get("asynchronous") is not None:
    summary["setup"]["asynchronous"] = copy.deepcopy(dict(base["asynchronous"]))
    summary["staleness"] = staleness_summary([r for rs in records_of.values() for r in rs])
  return summary


def summarize_beta2(b: plan.Budget, fmnist: Mapping, results: Mapping, units) -> dict:
  """Study 3: FedAdamom's final accuracy per partition and beta_2."""
  table = {part: {f"{beta2:g}": seed_summary(
      [results[u.name] for u in units if u.name in results
       and u.config["data"]["partition"] == plan.PARTITIONS[part]
       and u.config["server"]["beta_2"] == beta2], b.fmnist.target)
      for beta2 in b.beta2_grid} for part in fmnist}
  fixed = {part: {k: v for k, v in hparams(c["tuning"]["best"]["fedadamom"]).items()
                  if k != "server.beta_2"} for part, c in fmnist.items()}
  return {"table": table, "seeds": list(b.beta2_seeds), "rounds": b.fmnist.rounds,
          "fixed_hparams": fixed}


def summarize_hetero(b: plan.Budget, results: Mapping, units) -> dict:
  """Study 5: FedAdam and FedAdamom per partition, their difference paired by seed."""
  rows = []
  for label, partition in b.heterogeneity_items():
    per_opt = {opt: {str(u.config["seed"]): results[u.name] for u in units
                     if u.name in results and u.config["server"]["optimizer"] == opt
                     and u.config["data"]["partition"] == partition} for opt in PAIR}
    seeds = sorted(set(per_opt["fedadam"]) & set(per_opt["fedadamom"]))
    finals = [(per_opt["fedadamom"][s].get("final_test_accuracy"),
               per_opt["fedadam"][s].get("final_test_accuracy")) for s in seeds]
    rows.append({
        "alpha": label,
        **{opt: seed_summary(list(per_opt[opt].values()), b.fmnist.target) for opt in PAIR},
        "difference": mean_std([a - c for a, c in finals if a is not None and c is not None]),
        "paired_seeds": seeds})
  return {"rows": rows, "seeds": list(b.hetero_seeds), "rounds": b.fmnist.rounds}


def collect(ctx: Context) -> dict:
  """Tunes, runs (or only reads) and summarizes every study whose units are there."""
  b = ctx.budget
  ctx.log("tuning (equal budget per optimizer)")
  request = lambda base, db, lr, methods: {
      "base": base, "budget": db, "trials": db.tune_trials, "rounds": db.tune_rounds,
      "space": plan.search_space(lr, methods), "optimizers": methods}
  # Shakespeare first: its trials cost the most, and the batch runs in this order.
  requests = {"shakespeare": request(plan.shakespeare_base(b), b.shakespeare,
                                     plan.SHAKESPEARE_CLIENT_LR, b.shakespeare_methods)}
  requests.update({f"fmnist-{p}": request(plan.fmnist_base(b, plan.PARTITIONS[p]), b.fmnist,
                                          plan.FMNIST_CLIENT_LR, plan.OPTIMIZERS)
                   for p in b.partitions})
  requests.update({f"async-{plan.async_label(sigma)}": request(
      plan.async_base(b, sigma), b.fmnist, plan.FMNIST_CLIENT_LR, b.async_methods)
                   for sigma in b.async_spreads})
  escape_unit = units_lib.Unit(
      "escape/study", fn="benchmarks.paper.escape:run_study_dict",
      kwargs={"setup": dataclasses.asdict(b.escape)}, methods=escape.OPTIMIZERS,
      version=escape.VERSION)
  tuned = plan.tune(ctx, requests, seed=b.tune_seed, alongside=[escape_unit])
  # "fmnist-dir0.3" is study "fmnist/dir0.3"'s tuning.
  comparisons = {name.replace("-", "/", 1): {"tuning": outcome, **requests[name]}
                 for name, outcome in tuned.items() if outcome is not None}
  ctx.log("runs: best configs x seeds, beta_2 grid, heterogeneity, asynchronous steps, "
          "escape simulation")
  groups = {study: [_final(ctx, f"{study}/{opt}/seed{seed}", entry, cmp["base"], seed,
                           cmp["budget"].rounds)
                    for opt, entry in cmp["tuning"]["best"].items()
                    for seed in cmp["budget"].seeds] for study, cmp in comparisons.items()}
  fmnist = {p: comparisons[f"fmnist/{p}"] for p in b.partitions if f"fmnist/{p}" in comparisons}
  if len(fmnist) == len(b.partitions):
    groups["beta2"] = [
        _final(ctx, f"beta2/{part}/b{beta2:g}/seed{seed}", cmp["tuning"]["best"]["fedadamom"],
               cmp["base"], seed, b.fmnist.rounds, server={"beta_2": beta2})
        for part, cmp in fmnist.items() for beta2 in b.beta2_grid for seed in b.beta2_seeds]
  if "dir0.3" in fmnist:
    cmp = fmnist["dir0.3"]
    groups["hetero"] = [
        _final(ctx, f"hetero/a{label}/{opt}/seed{seed}", cmp["tuning"]["best"][opt],
               cmp["base"], seed, b.fmnist.rounds, data={"partition": dict(partition)})
        for label, partition in b.heterogeneity_items() for opt in PAIR
        for seed in b.hetero_seeds]
  unique = {u.name: u for u in [escape_unit] + [u for g in groups.values() for u in g]}
  done = ctx.run(list(unique.values()), "runs")
  summaries = {study: summarize_comparison(study, cmp, cmp["budget"], done, groups[study],
                                           chance_accuracy(cmp["base"]))
               for study, cmp in comparisons.items()}
  # "fmnist/dir0.3" is results["fmnist"]["dir0.3"].
  results: dict[str, Any] = {}
  for group in ("fmnist", "shakespeare", "async"):
    for study, summary in summaries.items():
      if study == group:
        results[group] = summary
      elif study.startswith(group + "/"):
        results.setdefault(group, {})[study.split("/", 1)[1]] = summary
  if "beta2" in groups:
    results["beta2"] = summarize_beta2(b, fmnist, done, groups["beta2"])
  if "hetero" in groups:
    results["hetero"] = summarize_hetero(b, done, groups["hetero"])
  if escape_unit.name in done:  # study 4: the simulation without its escape times, the fits
    raw = done[escape_unit.name]
    results["escape"] = {
        "raw": {k: v for k, v in raw.items() if k != "optimizers"},
        "per_optimizer": {name: {k: res[k] for k in ("lr", "per_k", "rounds_simulated",
                                                     "seconds")}
                          for name, res in raw["optimizers"].items()},
        "analysis": escape.analyse(raw, bootstrap=200 if b.mode == "full" else 30)}
  return results
