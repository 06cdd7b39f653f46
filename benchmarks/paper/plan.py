"""What the reproduction runs: budgets (full and quick), base experiments, search spaces, and
the equal-budget tuning of every method of a comparison, every trial a unit.

A comparison's tuning is a random-search sweep of the `tuning` package, planned with its
rules (`tuning.space`): each method's space merged from the registry's ranges, the
defaults and `search_space`, and trial i taking in each dimension the i-th draw of that
dimension's own seeded generator (common random numbers across methods). The trials run
as units, not as a Ray Tune experiment.

A method's best trial has the best mean `METRIC` over its last `LAST_K` evaluations among
those that completed the rounds without diverging (the first of equal ones); without one,
its final runs take the registry's defaults.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from typing import Any, Mapping, Optional, Sequence

from tff_fedadamom.metric_names import VALIDATION_ACCURACY

from benchmarks.paper import units as units_lib
from benchmarks.paper.escape import EscapeSetup

# The methods of the equal-budget comparison. FedCAda and FAFED are whole learning
# processes (their clients run Adam / STORM steps), the others server optimizers.
OPTIMIZERS = ("fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedamsgrad",
              "fadas", "fedcada", "fafed", "fedadamom")

# The paper's numbers and claims (FEDADAMOM.md); the report prints no other paper number.
PAPER = {
    # The setting of every headline and beta_2 number.
    "setup": "ResNet-18, 1000 rounds",
    "headline": [
        # data, metric, FedAdamom, best baseline (name), FedAdam
        ("CIFAR-10", "acc @1000 rounds", 88.93, (88.14, "FADAS"), None),
        ("CIFAR-10", "rounds to 81%", 307, (325, "FedCAda"), None),
        ("CIFAR-100", "acc @1000 rounds", 57.58, (54.67, "FADAS"), 53.67),
        ("CIFAR-100", "rounds to 50%", 392, (435, "FedAvgM"), None),
        ("Tiny-ImageNet", "acc @1000 rounds", 47.38, (43.83, "FADAS"), 41.75),
        ("Tiny-ImageNet", "rounds to 40%", 353, (517, "FADAS"), None),
    ],
    "shakespeare": {"fedadamom": 48.02, "best_baseline": (47.10, "FedYogi"), "rounds": 1000},
    # Dir(0.3) CIFAR-10, ResNet-18, 1000 rounds: accuracy (%) per beta_2.
    "beta2_dir03_cifar10": {0.01: 88.75, 0.05: 88.93, 0.1: 88.73, 0.2: 88.42, 0.3: 88.13},
    # How log(mean escape time) scales with the sharpness k, per optimizer.
    "escape": {"fedavgm": "1/k", "fedadam": "1/sqrt(k)", "fedadamom": "1/k"},
}

# Above chance accuracy, the margin of a failed run (`studies`).
FAILED_MARGIN = 0.01

BETA2_GRID = (0.01, 0.05, 0.1, 0.2, 0.3)
PARTITIONS = {"dir0.3": {"kind": "dirichlet", "alpha": 0.3}, "iid": {"kind": "iid"}}
HETEROGENEITY = (("0.1", {"kind": "dirichlet", "alpha": 0.1}),
                 ("0.3", {"kind": "dirichlet", "alpha": 0.3}),
                 ("1.0", {"kind": "dirichlet", "alpha": 1.0}),
                 ("iid", {"kind": "iid"}))

# Study 6: study 1's Dirichlet(0.3) experiment under buffered asynchronous steps
# (FedBuff, `tff_fedadamom.asynchrony`), with the server optimizers (FedCAda's and
# FAFED's clients keep state, which asynchronous steps do not support).
ASYNC_METHODS = ("fedavg", "fedavgm", "fedadam", "fadas", "fedadamom")
# Sigmas of the lognormal client speeds, one tuning and table each (sigma 1.5: the
# slowest tenth of the clients take about 7 times the median client's time).
ASYNC_SPREADS = (0.5, 1.5)
# Twice as many clients in flight as the server averages per step, FedBuff's
# staleness weight (1 + tau)^-0.5, updates staler than 10 steps dropped.
ASYNC_SETTINGS = {"concurrency": 10, "buffer_size": 5,
                  "staleness": {"kind": "polynomial", "a": 0.5}, "max_staleness": 10}
ASYNC_JITTER = 0.2


@dataclasses.dataclass(frozen=True)
class DataBudget:
  rounds: int
  eval_every: int
  tune_trials: int
  tune_rounds: int
  seeds: tuple
  target: float
  targets: tuple


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
  """Everything the run depends on besides the code. `fmnist` also budgets studies
  3, 5 and 6; `tune_seed` seeds every search (the same for all methods) and the
  tuning runs; `heterogeneity` holds labels of HETEROGENEITY."""

  mode: str
  workers: int = 2
  fmnist: DataBudget
  fmnist_model: dict
  shakespeare: DataBudget
  shakespeare_options: dict
  shakespeare_model: dict
  shakespeare_client: dict
  beta2_seeds: tuple
  hetero_seeds: tuple
  tune_seed: int = 0
  escape: EscapeSetup
  partitions: tuple = tuple(PARTITIONS)
  fmnist_client: dict = dataclasses.field(default_factory=dict)
  beta2_grid: tuple = BETA2_GRID
  heterogeneity: tuple = tuple(label for label, _ in HETEROGENEITY)
  shakespeare_methods: tuple = OPTIMIZERS
  async_spreads: tuple = ASYNC_SPREADS
  async_methods: tuple = ASYNC_METHODS

  def heterogeneity_items(self) -> list:
    return [(label, p) for label, p in HETEROGENEITY if label in self.heterogeneity]


FULL = Budget(
    mode="full",
    fmnist=DataBudget(rounds=100, eval_every=5, tune_trials=6, tune_rounds=50,
                      seeds=(1, 2, 3), target=0.75, targets=(0.7, 0.75, 0.8)),
    fmnist_model={"name": "mlp", "options": {"hidden": [64]}},
    shakespeare=DataBudget(rounds=50, eval_every=5, tune_trials=3, tune_rounds=30,
                           seeds=(1, 2, 3), target=0.3, targets=(0.25, 0.3, 0.35)),
    shakespeare_options={"max_clients": 100, "seq_length": 20},
    shakespeare_model={"name": "char_lstm", "options": {"embedding_dim": 8, "lstm_units": 64}},
    # The char-LSTM first sits on the unigram plateau for hundreds of SGD steps;
    # 40 client steps a round (200 examples / 10 x 2) leave it within the tuning rounds.
    shakespeare_client={"batch_size": 10, "max_examples": 200, "local_epochs": 2,
                        "clip_norm": 10.0},
    beta2_seeds=(1, 2), hetero_seeds=(1, 2, 3),
    escape=EscapeSetup(ks=(1.0, 1.41, 2.0, 2.83, 4.0, 5.66, 8.0, 11.3, 16.0),
                       dim=10, particles=512, max_rounds=200000, flat_log_tau=3.5,
                       chunk=5000),
)

# The fewest and smallest units that run every study and method: one trial of one
# round per method, also the final run (same seed and rounds: one unit). Building a
# char-LSTM is most of a Shakespeare unit, so study 2 compares FedAvg and FedAdamom.
QUICK = Budget(
    mode="quick",
    fmnist=DataBudget(rounds=1, eval_every=1, tune_trials=1, tune_rounds=1,
                      seeds=(0,), target=0.5, targets=(0.4, 0.5, 0.6)),
    fmnist_model={"name": "mlp", "options": {"hidden": [16]}},
    shakespeare=DataBudget(rounds=1, eval_every=1, tune_trials=1, tune_rounds=1,
                           seeds=(0,), target=0.15, targets=(0.1, 0.15, 0.2)),
    shakespeare_options={"max_clients": 10, "seq_length": 10},
    shakespeare_model={"name": "char_lstm", "options": {"embedding_dim": 4, "lstm_units": 8}},
    shakespeare_client={"batch_size": 10, "max_examples": 20, "clip_norm": 10.0},
    beta2_seeds=(0,), hetero_seeds=(0,),
    escape=EscapeSetup(ks=(1.0, 2.0, 4.0, 8.0, 16.0), dim=10, particles=48,
                       max_rounds=6000, flat_log_tau=3.5, chunk=3000),
    partitions=("dir0.3",), fmnist_client={"max_examples": 40}, beta2_grid=(0.05, 0.3),
    heterogeneity=("0.3", "iid"), shakespeare_methods=("fedavg", "fedadamom"),
    async_spreads=(1.5,), async_methods=("fedavg", "fadas"),
)


def budget(mode: str, workers: Optional[int] = None) -> Budget:
  chosen = {"full": FULL, "quick": QUICK}[mode]
  return chosen if workers is None else dataclasses.replace(chosen, workers=max(1, int(workers)))


# The share of each client's examples held out for tuning to select on (`METRIC`).
VALIDATION_FRACTION = 0.1


def _base(name: str, db: DataBudget, data: dict, model: dict, client: dict) -> dict:
  """A base experiment, whose server tuning fills in. The final runs keep the
  validation split: they train on the data their hparams were chosen with."""
  return {"name": name, "seed": 0, "rounds": db.rounds, "clients_per_round": 5,
          "eval_every": db.eval_every, "checkpoint_every": db.eval_every * 2,
          "output_dir": "unused", "targets": list(db.targets), "telemetry": False,
          "data": data, "model": copy.deepcopy(model), "client": client,
          "server": {"optimizer": "fedavg", "learning_rate": 1.0,
                     "client_weighting": "uniform"},
          "validation": {"fraction": VALIDATION_FRACTION}, "runtime": {"threads": 1}}


def fmnist_base(b: Budget, partition: dict) -> dict:
  return _base("fmnist", b.fmnist, {"name": "fashion_mnist", "num_clients": 100, "seed": 0,
                                    "partition": dict(partition), "eval_batch_size": 5000},
               b.fmnist_model, {"learning_rate": 0.1, "batch_size": 20, "local_epochs": 1,
                                **b.fmnist_client})


def async_label(sigma: float) -> str:
  return f"sigma{sigma:g}"


def async_base(b: Budget, sigma: float) -> dict:
  """Study 1's Dirichlet(0.3) base under buffered asynchronous steps."""
  base = fmnist_base(b, PARTITIONS["dir0.3"])
  base["asynchronous"] = {**copy.deepcopy(ASYNC_SETTINGS), "durations": {
      "kind": "lognormal", "sigma": float(sigma), "jitter": ASYNC_JITTER}}
  return base


def shakespeare_base(b: Budget) -> dict:
  return _base("shakespeare", b.shakespeare,
               {"name": "shakespeare", "seed": 0, "options": dict(b.shakespeare_options),
                "eval_batch_size": 1000}, b.shakespeare_model,
               {"learning_rate": 1.0, "local_epochs": 1, **b.shakespeare_client})


# Server learning-rate ranges, each a decade or more around the best values reported
# (FedAvg/FedAdamom ~1, FedAdam/FedYogi ~1e-2, FedAdagrad ~1e-1; Reddi et al. 2021,
# the FedAdamom paper); FADAS' reaches its authors' 1e-4 (Wang et al. 2024). FedCAda
# and FAFED average the clients' models (server eta 1, as in their papers). Some low
# ends reach a decade below values tuning first chose at an edge.
SERVER_LR = {"fedavg": (0.03, 3.0), "fedavgm": (0.01, 1.5), "fedadam": (1e-3, 0.3),
             "fedyogi": (1e-3, 0.3), "fedadagrad": (1e-3, 1.0), "fedamsgrad": (1e-3, 0.3),
             "fadas": (1e-4, 0.3), "fedadamom": (0.03, 3.0)}

# FedCAda's and FAFED's clients take normalized steps, lr * m / (sqrt(v) + eps),
# which do not scale with the gradient: Adam's usual range, not the SGD clients'.
ADAPTIVE_CLIENTS = ("fedcada", "fafed")
ADAPTIVE_CLIENT_LR = (1e-3, 0.1)

# The FedAdamom authors' code (Tenshawn/FedAdamom, models/distributed_training_utils.py)
# steps FedAdam and FedYogi without bias correction; the registry follows Reddi et
# al.'s (corrected). The study follows the paper's authors.
AUTHORS_UNCORRECTED = ("fedadam", "fedyogi")


def search_space(client_lr: tuple, methods: tuple = OPTIMIZERS) -> dict:
  """The search space of a comparison of `methods` (`tuning.space` merges it per method).

  beta_2 and FAFED's alpha keep the registry's ranges. FedAdamom's epsilon is its
  clip margin, not an adaptivity constant: it stays at the reference 1e-3.
  FedCAda's epsilon is its clients' Adam's (the registry's range, up to 0.1).
  """
  from tff_fedadamom.methods import search_ranges

  loguniform = lambda low, high: {"dist": "loguniform", "low": low, "high": high}
  space: dict[str, Any] = {"client.learning_rate": loguniform(*client_lr),
                           "server.epsilon": loguniform(1e-4, 1e-1)}
  per_opt = {opt: {"server.learning_rate": loguniform(*lr)} for opt, lr in SERVER_LR.items()}
  per_opt["fedavgm"]["server.momentum"] = {"dist": "uniform", "low": 0.5, "high": 0.95}
  per_opt["fedadamom"]["server.epsilon"] = 1e-3
  for opt in AUTHORS_UNCORRECTED:
    per_opt[opt]["server.bias_correction"] = False
  for opt in ADAPTIVE_CLIENTS:
    per_opt.setdefault(opt, {})["client.learning_rate"] = loguniform(*ADAPTIVE_CLIENT_LR)
  dist, low, high = search_ranges("fedcada")["epsilon"]
  per_opt["fedcada"]["server.epsilon"] = {"dist": dist, "low": low, "high": 0.1}
  # FAFED's epsilon is its rho, u / (sqrt(v) + rho): tuned beyond its default 0.1.
  per_opt["fafed"]["server.epsilon"] = loguniform(1e-4, 1.0)
  space.update({opt: entries for opt, entries in per_opt.items() if opt in methods})
  return space


FMNIST_CLIENT_LR = (0.01, 0.5)
SHAKESPEARE_CLIENT_LR = (1.0, 5.0)

# The tuning (the module docstring).
LAST_K = 3
# Tuning selects on the examples held out from the training clients, never the test set.
METRIC = VALIDATION_ACCURACY
BACKEND = "inprocess"


def as_sweep(name: str, request: Mapping, seed: int):
  """One comparison's tuning as a validated `tuning` sweep (random search, `request`'s
  base, optimizers, trials, rounds and space)."""
  from tff_fedadamom.config import config_to_dict, load_config
  from tuning.schema import num_evaluations, parse_sweep

  base, rounds = config_to_dict(load_config(dict(request["base"]))), request["rounds"]
  return parse_sweep({
      "name": name, "base": base, "optimizers": list(request["optimizers"]),
      "budget": {"trials_per_optimizer": request["trials"], "rounds": rounds},
      "space": copy.deepcopy(dict(request["space"])), "search": {"kind": "random", "seed": seed},
      "metric": {"name": METRIC, "mode": "max",
                 "last_k": min(LAST_K, num_evaluations(rounds, base["eval_every"]))}},
      source=f"the tuning of {name}")


def plan_sweep(name: str, request: Mapping, seed: int) -> dict:
  """The trials (units `tune/<name>/<optimizer>/trial<i>`) of one comparison's tuning,
  each method's fallback config (its space's fixed values, registry defaults) and the
  ranges it is tuned over (dotted path -> distribution)."""
  from tuning.space import experiment_dict, resolve, sample_trials

  sweep, methods = as_sweep(name, request, seed), {}
  for optimizer in sweep.optimizers:
    space = resolve(sweep, optimizer)
    config = functools.partial(experiment_dict, sweep, optimizer, output_dir="unused",
                               threads=1, space=space)
    methods[optimizer] = {"fallback": config({}), "ranges": {
        p: d.to_dict() for p, d in space.tuned.items()}, "trials": [
        (params, units_lib.Unit(f"tune/{name}/{optimizer}/trial{i}", config=config(params)))
        for i, params in enumerate(sample_trials(sweep, optimizer))]}
  return {"sweep": sweep, "space": request["space"], "methods": methods}


def outcome(sweep: Mapping, results: Mapping) -> dict:
  """A sweep's outcome from the stored trials: per method its best trial's params,
  objective and config, and the trial list."""
  from tuning.trainable import objective_from_history

  best, tuning = {}, sweep["sweep"]
  for optimizer, planned in sweep["methods"].items():
    trials, chosen = [], None
    for params, unit in planned["trials"]:
      if unit.name not in results:
        continue
      r = results[unit.name]
      value = objective_from_history(r["history"] or [], METRIC, tuning.metric.last_k)
      diverged = r["status"] != "completed" or value is None or not math.isfinite(value)
      trial = {"params": params, "objective": value, "diverged": diverged,
               "rounds": r.get("rounds_completed"), "final": r.get("final_test_accuracy")}
      trials.append(trial)
      if not diverged and (trial["rounds"] or 0) >= tuning.budget.rounds and (
          chosen is None or value > chosen[0]["objective"]):
        chosen = (trial, unit)
    best_trial, best_unit = chosen or ({"params": None, "objective": None}, None)
    best[optimizer] = {
        "params": best_trial["params"], "objective": best_trial["objective"],
        "trials_run": len(trials), "trials_diverged": sum(t["diverged"] for t in trials),
        "trials": trials, "fallback_defaults": chosen is None, "ranges": planned["ranges"],
        "config": copy.deepcopy(best_unit.config if best_unit else planned["fallback"])}
  return {"backend": BACKEND, "metric": dataclasses.asdict(tuning.metric),
          "seed": tuning.search.seed, "space": sweep["space"], "best": best}


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
