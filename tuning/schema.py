"""The sweep file: typed schema, safe YAML loading, one error type.

A sweep file says which server optimizers to tune, on which experiment, with
which budget, search space, search algorithm, early stopping, objective and
resources. It is validated completely by `load_sweep`, before Ray starts: every
problem raises a `SweepConfigError` naming the file, the field, the value and
what is allowed.

    name: fmnist_all_optimizers         # sweep directory name (default: file stem)
    base: ../experiments/fmnist.yaml    # experiment config: path (relative to this
                                        # file) or an inline mapping
    optimizers: [fedadamom, fedavg, fedavgm, fedadam, fedyogi, fedadagrad, fadas]
    budget: {trials_per_optimizer: 16, rounds: 100}   # the same for every optimizer
    space:                              # dotted experiment path -> distribution
      client.learning_rate: {dist: loguniform, low: 1.0e-3, high: 1.0}
      server.epsilon: null              # null: do not tune (keep the base value)
      fedadamom:                        # entries for one optimizer only
        server.beta_2: {dist: uniform, low: 0.01, high: 0.3}
    search: {kind: optuna, seed: 0}     # random | grid | optuna
    scheduler: {kind: asha, grace_period: 10, reduction_factor: 2}   # or {kind: none}
    metric: {name: test/accuracy, last_k: 3, mode: max}
    resources: {cpus_per_trial: 1, gpus_per_trial: 0, max_concurrent_trials: null,
                time_budget_s: null, address: null, storage_path: runs/sweeps,
                max_failures: 1}

Space entries are merged in this order, later winning: the defaults from the
literature (the optimizer registry's search ranges and `tuning.space.DEFAULT_SPACE`), the top-level entries, the entries
under the optimizer's name. Server hparams (`server.<name>`) apply only to the
optimizers whose registry entry lists them as tunable. A scalar instead of a
distribution fixes the value for every trial; `null` removes the entry.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Iterable, Mapping, Optional, Union

import yaml

from tff_fedadamom.config.errors import ConfigError
from tff_fedadamom.config.loader import read_yaml
from tff_fedadamom.config.schema import ray_address, ray_resource
from tff_fedadamom.naming import closest

DISTRIBUTIONS = ("loguniform", "uniform", "choice", "grid")
SEARCH_KINDS = ("random", "grid", "optuna")
SCHEDULER_KINDS = ("none", "asha")
MODES = ("max", "min")
METRICS = ("test/accuracy", "test/loss", "train/accuracy", "train/loss")
DEFAULT_STORAGE_PATH = "runs/sweeps"


class SweepConfigError(ConfigError):
  """A sweep file is wrong. The message names the file, the field, the value and
  what is allowed.

  Attributes:
    source: The sweep file (or '<dict>').
    field: Dotted path of the field, e.g. 'space.server.beta_2.low'.
    value: The offending value (None when not applicable).
    allowed: What is allowed, in words.
  """


@dataclasses.dataclass(frozen=True)
class Distribution:
  """One search dimension: `loguniform`/`uniform` over [low, high], or
  `choice`/`grid` over `values` (grid: every value is run, only with
  `search.kind: grid`)."""

  dist: str
  low: Optional[float] = None
  high: Optional[float] = None
  values: Optional[tuple] = None

  def extremes(self) -> tuple:
    """The values whose validity bounds the validity of every sample."""
    if self.dist in ("loguniform", "uniform"):
      return (self.low, self.high)
    return tuple(self.values)

  def to_dict(self) -> dict:
    if self.dist in ("loguniform", "uniform"):
      return {"dist": self.dist, "low": self.low, "high": self.high}
    return {"dist": self.dist, "values": list(self.values)}


# A space entry: a distribution, a fixed value, or None (removes a default).
SpaceEntry = Union[Distribution, Any, None]


@dataclasses.dataclass(frozen=True)
class Budget:
  trials_per_optimizer: int
  rounds: int


@dataclasses.dataclass(frozen=True)
class Search:
  kind: str = "random"
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class Scheduler:
  kind: str = "none"
  grace_period: int = 1
  reduction_factor: float = 2.0


@dataclasses.dataclass(frozen=True)
class Metric:
  """The objective: `name` averaged over the last `last_k` evaluations."""

  name: str = "test/accuracy"
  last_k: int = 1
  mode: str = "max"


@dataclasses.dataclass(frozen=True)
class Resources:
  cpus_per_trial: float = 1.0
  gpus_per_trial: float = 0.0
  max_concurrent_trials: Optional[int] = None
  time_budget_s: Optional[float] = None
  address: Optional[str] = None
  storage_path: str = DEFAULT_STORAGE_PATH
  max_failures: int = 1


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A validated sweep.

  Attributes:
    name: Sweep name; its directory is `<resources.storage_path>/<name>`.
    source: The file it was read from ('<dict>' for a mapping).
    base: The validated base experiment (`ExperimentConfig`).
    optimizers: Server optimizer names, from the optimizer registry.
    budget: Trials per optimizer and rounds per trial, equal for all optimizers.
    space: Top-level space entries (dotted path -> entry), as written.
    space_by_optimizer: Per-optimizer space entries, as written.
    search, scheduler, metric, resources: As in the file, with defaults filled.
  """

  name: str
  source: str
  base: Any
  optimizers: tuple
  budget: Budget
  space: Mapping[str, SpaceEntry]
  space_by_optimizer: Mapping[str, Mapping[str, SpaceEntry]]
  search: Search
  scheduler: Scheduler
  metric: Metric
  resources: Resources

  @property
  def sweep_dir(self) -> str:
    """Absolute directory holding the Tune experiments and the exports."""
    return os.path.abspath(os.path.join(self.resources.storage_path, self.name))


TOP_LEVEL = ("name", "base", "optimizers", "budget", "space", "search", "scheduler",
             "metric", "resources")


# ---------------------------------------------------------------------------- helpers


def _suggest(word: Any, valid: Iterable[str]) -> str:
  """', did you mean X?' for the closest valid key (by spelling, or by prefix)."""
  word, valid = str(word), [str(v) for v in valid]
  close = closest(word, valid)
  if close is None and len(word) >= 3:
    close = next((v for v in valid if v.startswith(word) or word.startswith(v)), None)
  return f", did you mean '{close}'?" if close else ""


def _reject_unknown(raw: Mapping, valid: Iterable[str], source: str, prefix: str) -> None:
  valid = list(valid)
  for key in raw:
    if key not in valid:
      raise SweepConfigError(source, f"{prefix}{key}", "unknown key" + _suggest(key, valid),
                             allowed=", ".join(valid))


def _mapping(raw: Any, source: str, field: str) -> dict:
  if raw is None:
    return {}
  if not isinstance(raw, Mapping):
    raise SweepConfigError(source, field, "must be a mapping", value=raw)
  for key in raw:
    if not isinstance(key, str):
      raise SweepConfigError(source, f"{field}.{key}", "keys must be strings", value=key)
  return dict(raw)


def _is_number(value: Any) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def _numeric_string(value: Any) -> bool:
  """A string YAML 1.1 did not read as a number, such as '1e-3' or '1.0e38'."""
  if not isinstance(value, str):
    return False
  try:
    float(value)
  except ValueError:
    return False
  return True


def _string_number_error(source: str, field: str, value: str) -> SweepConfigError:
  return SweepConfigError(
      source, field, "YAML read this as a string, not a number", value=value,
      allowed="a number with a dot and a signed exponent, e.g. 1.0e-3 or 1.0e+38")


def _number(raw: Mapping, key: str, default: Any, source: str, field: str, *,
            check=None, allowed: str = "a finite number", integer: bool = False,
            nullable: bool = False):
  value = raw.get(key, default)
  if value is None and nullable:
    return None
  if _numeric_string(value):
    raise _string_number_error(source, field, value)
  ok = _is_number(value) and (not integer or float(value).is_integer())
  if not ok or (check is not None and not check(value)):
    raise SweepConfigError(source, field, "wrong type" if not ok else "out of range",
                           value=value, allowed=allowed + (" or null" if nullable else ""))
  return int(value) if integer else float(value)


def _choice(raw: Mapping, key: str, default: str, valid: Iterable[str], source: str,
            field: str) -> str:
  value = raw.get(key, default)
  valid = list(valid)
  if value not in valid:
    raise SweepConfigError(source, field, "unknown value" + _suggest(value, valid),
                           value=value, allowed=", ".join(valid))
  return value


def read_sweep_yaml(path: Union[str, os.PathLike]) -> Any:
  """Safe-loads a sweep file; every failure is a SweepConfigError naming it."""
  return read_yaml(path, what="sweep file", error=SweepConfigError)


# ---------------------------------------------------------------------------- sections


def _parse_base(raw: Any, source: str, base_dir: str):
  from tff_fedadamom.config import ConfigError, load_config

  if raw is None:
    raise SweepConfigError(source, "base", "missing",
                           allowed="a path to an experiment YAML or an inline mapping")
  if isinstance(raw, str):
    path = raw if os.path.isabs(raw) else os.path.join(base_dir, raw)
    if not os.path.isfile(path):
      raise SweepConfigError(source, "base", "experiment config not found", value=raw,
                             allowed=f"a YAML path relative to {base_dir or '.'}")
  elif isinstance(raw, Mapping):
    path = dict(raw)
  else:
    raise SweepConfigError(source, "base", "wrong type", value=raw,
                           allowed="a path to an experiment YAML or an inline mapping")
  try:
    base = load_config(path)
  except ConfigError as e:
    raise SweepConfigError(source, "base", f"invalid experiment config: {e}") from None
  if base.runtime.backend == "ray":
    # A trial is one Ray task; its own actors would need a placement group.
    raise SweepConfigError(source, "base.runtime.backend",
                           "the ray backend does not run inside sweep trials yet",
                           value="ray", allowed="'auto', 'inprocess' or 'tff_cpp'")
  return base


def _parse_optimizers(raw: Any, source: str) -> tuple:
  from tff_fedadamom.optimizers import list_optimizers

  valid = list_optimizers()
  if raw is None:
    return tuple(valid)
  if isinstance(raw, str):
    raw = [raw]
  if not isinstance(raw, (list, tuple)) or not raw:
    raise SweepConfigError(source, "optimizers", "must be a non-empty list", value=raw,
                           allowed=", ".join(valid))
  for i, name in enumerate(raw):
    if name not in valid:
      raise SweepConfigError(source, f"optimizers[{i}]",
                             "unknown server optimizer" + _suggest(name, valid), value=name,
                             allowed=", ".join(valid))
  if len(set(raw)) != len(raw):
    dup = next(n for n in raw if list(raw).count(n) > 1)
    raise SweepConfigError(source, "optimizers", "listed twice", value=dup)
  return tuple(raw)


def _parse_budget(raw: Any, source: str) -> Budget:
  raw = _mapping(raw, source, "budget")
  _reject_unknown(raw, ("trials_per_optimizer", "rounds"), source, "budget.")
  for key in ("trials_per_optimizer", "rounds"):
    if key not in raw:
      raise SweepConfigError(source, f"budget.{key}", "missing (the budget must be "
                             "explicit: it is what makes optimizers comparable)",
                             allowed="an integer >= 1")
  return Budget(
      trials_per_optimizer=_number(raw, "trials_per_optimizer", None, source,
                                   "budget.trials_per_optimizer", check=lambda v: v >= 1,
                                   integer=True, allowed="an integer >= 1"),
      rounds=_number(raw, "rounds", None, source, "budget.rounds", check=lambda v: v >= 1,
                     integer=True, allowed="an integer >= 1"))


def parse_distribution(raw: Any, source: str, field: str) -> SpaceEntry:
  """A space entry: mapping with `dist` -> Distribution; scalar -> fixed; None."""
  if raw is None or not isinstance(raw, Mapping):
    if _numeric_string(raw):
      raise _string_number_error(source, field, raw)
    if isinstance(raw, (list, tuple)):
      raise SweepConfigError(source, field, "a list is ambiguous", value=raw,
                             allowed="{dist: choice, values: [...]} or "
                             "{dist: grid, values: [...]}")
    return raw
  raw = _mapping(raw, source, field)
  if "dist" not in raw:
    raise SweepConfigError(source, f"{field}.dist", "missing",
                           allowed=", ".join(DISTRIBUTIONS))
  dist = _choice(raw, "dist", None, DISTRIBUTIONS, source, f"{field}.dist")
  if dist in ("loguniform", "uniform"):
    _reject_unknown(raw, ("dist", "low", "high"), source, f"{field}.")
    for key in ("low", "high"):
      if key not in raw:
        raise SweepConfigError(source, f"{field}.{key}", f"missing for {dist}",
                               allowed="a finite number")
    low = _number(raw, "low", None, source, f"{field}.low")
    high = _number(raw, "high", None, source, f"{field}.high")
    if dist == "loguniform" and low <= 0:
      raise SweepConfigError(source, f"{field}.low", "out of range for loguniform",
                             value=raw["low"], allowed="a number > 0")
    if high <= low:
      raise SweepConfigError(source, f"{field}.high", "must be greater than low",
                             value=raw["high"], allowed=f"a number > {raw['low']}")
    return Distribution(dist, low=low, high=high)
  _reject_unknown(raw, ("dist", "values"), source, f"{field}.")
  values = raw.get("values")
  if not isinstance(values, (list, tuple)) or not values:
    raise SweepConfigError(source, f"{field}.values", f"must be a non-empty list for {dist}",
                           value=values)
  for i, value in enumerate(values):
    if isinstance(value, (Mapping, list, tuple)) or value is None:
      raise SweepConfigError(source, f"{field}.values[{i}]", "wrong type", value=value,
                             allowed="a number, string or true/false")
    if _numeric_string(value):
      raise _string_number_error(source, f"{field}.values[{i}]", value)
  return Distribution(dist, values=tuple(values))


_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _parse_space(raw: Any, source: str, optimizers: tuple):
  from tff_fedadamom.optimizers import list_optimizers

  raw = _mapping(raw, source, "space")
  shared, by_optimizer = {}, {}
  registered = list_optimizers()
  for key, value in raw.items():
    if key in registered:
      sub = _mapping(value, source, f"space.{key}")
      by_optimizer[key] = {}
      for path, entry in sub.items():
        _check_path_syntax(path, source, f"space.{key}.{path}")
        by_optimizer[key][path] = parse_distribution(entry, source, f"space.{key}.{path}")
      continue
    if "." not in key:
      raise SweepConfigError(
          source, f"space.{key}", "neither a dotted experiment path nor an optimizer name"
          + _suggest(key, registered),
          allowed="a dotted path such as server.learning_rate, or one of "
          + ", ".join(registered))
    _check_path_syntax(key, source, f"space.{key}")
    shared[key] = parse_distribution(value, source, f"space.{key}")
  for name in by_optimizer:
    if name not in optimizers:
      raise SweepConfigError(source, f"space.{name}", "entries for an optimizer that is "
                             "not in 'optimizers'", value=name,
                             allowed=", ".join(optimizers))
  return shared, by_optimizer


def _check_path_syntax(path: Any, source: str, field: str) -> None:
  if not isinstance(path, str) or not _PATH.match(path):
    raise SweepConfigError(source, field, "not a dotted experiment path", value=path,
                           allowed="e.g. server.learning_rate or client.learning_rate")
  if path in ("server.optimizer", "output_dir", "rounds", "name"):
    raise SweepConfigError(source, field, "set by the sweep itself and cannot be searched",
                           value=path, allowed="'optimizers' chooses the optimizer, "
                           "'budget.rounds' the rounds")


def _parse_search(raw: Any, source: str) -> Search:
  raw = _mapping(raw, source, "search")
  _reject_unknown(raw, ("kind", "seed"), source, "search.")
  return Search(kind=_choice(raw, "kind", "random", SEARCH_KINDS, source, "search.kind"),
                seed=_number(raw, "seed", 0, source, "search.seed", integer=True,
                             check=lambda v: v >= 0, allowed="an integer >= 0"))


def _parse_scheduler(raw: Any, source: str, budget: Budget) -> Scheduler:
  raw = _mapping(raw, source, "scheduler")
  kind = _choice(raw, "kind", "none", SCHEDULER_KINDS, source, "scheduler.kind")
  if kind == "none":
    _reject_unknown(raw, ("kind",), source, "scheduler.")
    return Scheduler(kind="none")
  _reject_unknown(raw, ("kind", "grace_period", "reduction_factor"), source, "scheduler.")
  return Scheduler(
      kind=kind,
      grace_period=_number(raw, "grace_period", 1, source, "scheduler.grace_period",
                           integer=True, check=lambda v: 1 <= v <= budget.rounds,
                           allowed=f"an integer number of rounds in [1, {budget.rounds}] "
                           "(budget.rounds)"),
      reduction_factor=_number(raw, "reduction_factor", 2, source,
                               "scheduler.reduction_factor", check=lambda v: v > 1,
                               allowed="a number > 1"))


def num_evaluations(rounds: int, eval_every: int) -> int:
  """How many evaluations a run of `rounds` makes (every `eval_every`, and the last)."""
  return rounds // eval_every + (1 if rounds % eval_every else 0)


def _parse_metric(raw: Any, source: str, evaluations: int) -> Metric:
  raw = _mapping(raw, source, "metric")
  _reject_unknown(raw, ("name", "last_k", "mode"), source, "metric.")
  name = _choice(raw, "name", "test/accuracy", METRICS, source, "metric.name")
  default_mode = "min" if name.endswith("loss") else "max"
  return Metric(
      name=name,
      last_k=_number(raw, "last_k", 1, source, "metric.last_k", integer=True,
                     check=lambda v: 1 <= v <= evaluations,
                     allowed=f"an integer in [1, {evaluations}] (the evaluations in "
                     "budget.rounds at base.eval_every)"),
      mode=_choice(raw, "mode", default_mode, MODES, source, "metric.mode"))




def _parse_resources(raw: Any, source: str) -> Resources:
  raw = _mapping(raw, source, "resources")
  _reject_unknown(raw, [f.name for f in dataclasses.fields(Resources)], source,
                  "resources.")
  address = raw.get("address")
  if address is not None and (not isinstance(address, str) or not ray_address(address)):
    raise SweepConfigError(source, "resources.address", "not a Ray address", value=address,
                           allowed="null (a local Ray on 127.0.0.1), 'auto' (the cluster "
                           "this machine belongs to) or host:port of a cluster's head")
  storage = raw.get("storage_path", DEFAULT_STORAGE_PATH)
  if not isinstance(storage, str) or not storage or "://" in storage:
    raise SweepConfigError(source, "resources.storage_path", "not a local path",
                           value=storage, allowed="a directory path; on a multi-node "
                           "cluster, one that every node mounts at the same place")
  gpus = _number(raw, "gpus_per_trial", 0, source, "resources.gpus_per_trial",
                 check=ray_resource,
                 allowed="0, a fraction of one GPU, or a whole number of GPUs")
  return Resources(
      cpus_per_trial=_number(raw, "cpus_per_trial", 1, source, "resources.cpus_per_trial",
                             check=lambda v: v > 0, allowed="a number > 0"),
      gpus_per_trial=gpus,
      max_concurrent_trials=_number(raw, "max_concurrent_trials", None, source,
                                    "resources.max_concurrent_trials", integer=True,
                                    nullable=True, check=lambda v: v >= 1,
                                    allowed="an integer >= 1"),
      time_budget_s=_number(raw, "time_budget_s", None, source, "resources.time_budget_s",
                            nullable=True, check=lambda v: v > 0, allowed="seconds > 0"),
      address=address,
      storage_path=storage,
      max_failures=_number(raw, "max_failures", 1, source, "resources.max_failures",
                           integer=True, check=lambda v: v >= 0,
                           allowed="an integer >= 0 (restarts of a crashed trial)"))


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def parse_sweep(raw: Any, source: str = "<dict>", base_dir: str = "") -> Sweep:
  """Builds and fully validates a `Sweep` from a plain mapping."""
  if not isinstance(raw, Mapping):
    raise SweepConfigError(source, "", "a sweep file must be a mapping of sections",
                           value=raw)
  raw = _mapping(raw, source, "")
  _reject_unknown(raw, TOP_LEVEL, source, "")
  default_name = (os.path.splitext(os.path.basename(source))[0]
                  if source != "<dict>" else "sweep")
  name = raw.get("name", default_name)
  if not isinstance(name, str) or not _NAME.match(name):
    raise SweepConfigError(source, "name", "not a usable directory name", value=name,
                           allowed="letters, digits, '_', '-', '.'")
  base = _parse_base(raw.get("base"), source, base_dir)
  optimizers = _parse_optimizers(raw.get("optimizers"), source)
  budget = _parse_budget(raw.get("budget"), source)
  space, by_optimizer = _parse_space(raw.get("space"), source, optimizers)
  search = _parse_search(raw.get("search"), source)
  scheduler = _parse_scheduler(raw.get("scheduler"), source, budget)
  metric = _parse_metric(raw.get("metric"), source,
                         num_evaluations(budget.rounds, base.eval_every))
  resources = _parse_resources(raw.get("resources"), source)
  sweep = Sweep(name=name, source=source, base=base, optimizers=optimizers, budget=budget,
                space=space, space_by_optimizer=by_optimizer, search=search,
                scheduler=scheduler, metric=metric, resources=resources)
  from tuning import space as space_lib  # the per-optimizer checks need the registry

  space_lib.check_sweep(sweep)
  return sweep


def load_sweep(sweep: Union[str, os.PathLike, Mapping, Sweep]) -> Sweep:
  """Loads and validates a sweep.

  Args:
    sweep: A YAML path, a plain mapping (a relative `base` path is then relative
      to the current directory), or a `Sweep` (returned as is).

  Raises:
    SweepConfigError: naming the file, field, value and what is allowed.
  """
  if isinstance(sweep, Sweep):
    return sweep
  if isinstance(sweep, Mapping):
    return parse_sweep(sweep, "<dict>", "")
  path = os.fspath(sweep)
  return parse_sweep(read_sweep_yaml(path), path, os.path.dirname(path))


def _entry_to_yaml(entry: SpaceEntry):
  return entry.to_dict() if isinstance(entry, Distribution) else entry


def sweep_to_dict(sweep: Sweep) -> dict:
  """The YAML-ready mapping of `sweep`, with the base experiment inlined, so the
  file stands alone (it is what a sweep directory keeps as `sweep.yaml`)."""
  from tff_fedadamom.config import config_to_dict

  space = {k: _entry_to_yaml(v) for k, v in sweep.space.items()}
  for name, entries in sweep.space_by_optimizer.items():
    space[name] = {k: _entry_to_yaml(v) for k, v in entries.items()}
  return {
      "name": sweep.name,
      "base": config_to_dict(sweep.base),
      "optimizers": list(sweep.optimizers),
      "budget": dataclasses.asdict(sweep.budget),
      "space": space,
      "search": dataclasses.asdict(sweep.search),
      "scheduler": (dataclasses.asdict(sweep.scheduler) if sweep.scheduler.kind != "none"
                    else {"kind": "none"}),
      "metric": dataclasses.asdict(sweep.metric),
      "resources": dataclasses.asdict(sweep.resources),
  }


def dump_sweep(sweep: Sweep, path: str) -> str:
  """Writes `sweep_to_dict(sweep)` as YAML atomically; returns the text."""
  from tff_fedadamom.atomic_io import atomic_write_text

  text = yaml.safe_dump(sweep_to_dict(sweep), sort_keys=False, default_flow_style=False)
  atomic_write_text(path, text)
  return text
