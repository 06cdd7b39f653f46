"""Stage 0 of the reproduction: two short runs measure this machine, and the time
a run from scratch would take is estimated from them (`reproduce` prints it
before any training). The calibration runs describe the machine, not the
study: they live in the local cache, never among the committed units. The quick
run has none: it estimates from its own units, after running them.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from benchmarks.paper import plan
from benchmarks.paper import runs as runs_lib
from benchmarks.paper import units as units_lib

# What one Ray Tune trial costs besides its rounds (Tune's bookkeeping and
# checkpoints, the trial's share of building each optimizer's process in the
# sweep's long-lived workers): the median trial of the quickstart sweep,
# measured by benchmarks/sweep_scaling.py on the development machine (5.8 s).
RAY_TRIAL_OVERHEAD_S = 6.0
RAY_SWEEP_OVERHEAD_S = 15.0 + 5.0   # ray.init + the sweep's one Tune experiment
# Escape simulation: seconds per particle-round of the vectorized FedAdamom step
# (the slowest of the three), measured on the development machine.
ESCAPE_S_PER_PARTICLE_ROUND = 2.2e-7



def calibration_units(b: plan.Budget, cache: runs_lib.Cache) -> list:
  """A short Fashion-MNIST and a short Shakespeare run (side by side, as the pool
  runs everything), each evaluated once, at its last round, each after a warm-up
  run in its worker (see runs.calibration_unit). They measure this machine, so
  they live in the local cache, not in the study's committed units."""
  fm = plan.fmnist_base(b, plan.PARTITIONS["dir0.3"])
  fm.update(rounds=10, seed=0)
  fm["server"] = {"optimizer": "fedadamom", "learning_rate": 1.0,
                  "client_weighting": "uniform"}
  fm["client"]["learning_rate"] = 0.1
  sh = plan.shakespeare_base(b)
  sh.update(rounds=6, seed=0)
  units = []
  for name, config in (("calibration/fmnist", fm), ("calibration/shakespeare", sh)):
    config.update(eval_every=config["rounds"], checkpoint_every=config["rounds"], name=name)
    digest = units_lib.spec_hash(units_lib.spec_of_config(config))
    config["output_dir"] = os.path.join(cache.root, "runs", f"{name}-{digest}")
    units.append(units_lib.Unit(name, fn="benchmarks.paper.runs:calibration_unit",
                                kwargs={"config": config}))
  return units


def per_round(result: Mapping) -> tuple:
  """(seconds per round, extra seconds per evaluation, fixed seconds per run) of a
  calibration run: the median round without an evaluation, the median extra of the
  rounds with one, and the rest of the run's time (process start, data, the first
  round's tracing, saving)."""
  seconds = result.get("round_seconds") or []
  evals = set(result.get("eval_rounds") or [])
  plain = [s for i, s in enumerate(seconds, 1) if i not in evals and i > 1]
  with_eval = [s for i, s in enumerate(seconds, 1) if i in evals and i > 1]
  total = float(result.get("total_s") or 0.0)
  if not plain:
    rounds = max(1, len(seconds))
    return total / rounds, 0.0, 0.0
  step = float(sorted(plain)[len(plain) // 2])
  extra = max(0.0, float(sorted(with_eval)[len(with_eval) // 2]) - step) if with_eval else 0.0
  fixed = max(0.0, total - step * len(seconds) - extra * len(evals))
  return step, extra, fixed


def estimate(b: plan.Budget, calib: Mapping, backend: str) -> dict:
  """Seconds per stage, from the calibration runs (cached units are not subtracted:
  this is the cost of a run from scratch)."""
  f_round, f_eval, f_start = per_round(calib["calibration/fmnist"])
  s_round, s_eval, s_start = per_round(calib["calibration/shakespeare"])
  # Evaluation cost folded into the per-round cost at each data set's eval_every.
  f_round += f_eval / b.fmnist.eval_every
  s_round += s_eval / b.shakespeare.eval_every
  n_opt, n_shakespeare = len(plan.OPTIMIZERS), len(b.shakespeare_methods)
  w = b.workers

  def runs(n, rounds, spr, start):
    return n * (rounds * spr + start)

  tune_f = runs(len(b.partitions) * n_opt * b.fmnist.tune_trials, b.fmnist.tune_rounds,
                f_round, f_start)
  tune_s = runs(n_shakespeare * b.shakespeare.tune_trials, b.shakespeare.tune_rounds,
                s_round, s_start)
  n_trials = (len(b.partitions) * b.fmnist.tune_trials * n_opt
              + b.shakespeare.tune_trials * n_shakespeare)
  if backend == "ray":
    tuning = (tune_f + tune_s + n_trials * RAY_TRIAL_OVERHEAD_S) / w \
        + 3 * RAY_SWEEP_OVERHEAD_S
  else:
    tuning = (tune_f + tune_s) / w
  finals_f = runs(len(b.partitions) * n_opt * len(b.fmnist.seeds), b.fmnist.rounds,
                  f_round, f_start)
  finals_s = runs(n_shakespeare * len(b.shakespeare.seeds), b.shakespeare.rounds, s_round,
                  s_start)
  beta2 = runs(len(b.partitions) * len(b.beta2_grid) * len(b.beta2_seeds),
               b.fmnist.rounds, f_round, f_start)
  new_hetero = [a for a in b.heterogeneity if a != "0.3"]
  hetero = runs(len(new_hetero) * 2 * len(b.hetero_seeds), b.fmnist.rounds, f_round, f_start)
  e = b.escape
  escape = 1.25 * ESCAPE_S_PER_PARTICLE_ROUND * e.max_rounds * e.particles * len(e.ks) + 20
  pool = (finals_f + finals_s + beta2 + hetero + escape) / w
  return {
      "seconds_per_round": {"fashion_mnist": f_round, "shakespeare": s_round},
      "start_up_s": {"fashion_mnist": f_start, "shakespeare": s_start},
      "tuning_s": tuning,
      "runs_s": pool,
      "escape_s": escape,
      "total_s": tuning + pool + 60.0,
  }


def minutes(seconds: float) -> str:
  """The report's one way of writing a duration."""
  return f"{seconds / 60:.1f} min"


def calibrate(ctx) -> Optional[dict]:
  """Runs (or reuses) the calibration runs and logs the estimate; its timing line.
  The quick run has none: its estimate comes from its own units (`from_units`)."""
  if ctx.budget.mode == "quick":
    return None
  calib = runs_lib.run_units(calibration_units(ctx.budget, ctx.cache), ctx.cache.store(),
                             ctx.cache, ctx.pool, log=ctx.log, label="calibration")
  return _log_estimate(ctx, calib)


def from_units(ctx) -> Optional[dict]:
  """The estimate from the first stored Fashion-MNIST and Shakespeare units (the
  quick run's, whose tiny budget is not worth two extra runs)."""
  calib = {}
  for record in ctx.store.records():
    spec = record["spec"]
    data = spec.get("data", {}).get("name") if record["kind"] == "experiment" else None
    name = {"fashion_mnist": "calibration/fmnist", "shakespeare": "calibration/shakespeare"}
    if data in name and name[data] not in calib:
      calib[name[data]] = record["result"]
  return _log_estimate(ctx, calib)


def _log_estimate(ctx, calib: Mapping) -> Optional[dict]:
  if len(calib) != 2:
    return None
  est = estimate(ctx.budget, calib, ctx.backend)
  log = ctx.log
  log(f"measured: Fashion-MNIST {est['seconds_per_round']['fashion_mnist']:.2f} s/round "
      f"(+{est['start_up_s']['fashion_mnist']:.1f} s start-up per run), Shakespeare "
      f"{est['seconds_per_round']['shakespeare']:.2f} s/round "
      f"(+{est['start_up_s']['shakespeare']:.1f} s)")
  log(f"ESTIMATE for a run from scratch: {minutes(est['total_s'])} (tuning "
      f"{minutes(est['tuning_s'])}, other runs {minutes(est['runs_s'])} incl. "
      f"escape simulation {minutes(est['escape_s'])} of one worker); stored units "
      "are skipped")
  return {"estimate from calibration (from scratch)": minutes(est["total_s"])}
