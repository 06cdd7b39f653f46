"""The sweep file: typed schema, safe YAML loading, one error type.

`load_sweep` validates a sweep file completely before Ray starts: every problem
raises a `SweepConfigError` naming the file, the field, the value and what is
allowed.

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

Each optimizer's space is merged from the defaults and these entries
(`tuning.space`); a scalar fixes the value for every trial, `null` removes it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Iterable, Mapping, Optional, Union

import yaml

from tff_fedadamom.config.loader import apply_overrides, read_yaml
from tff_fedadamom.config.sections import build_section, coerce, reject_unknown
from tff_fedadamom.config.schema import (BACKENDS, RAY, checked_field, nonnegative, positive,
                                         ray_address, ray_resource)
from tff_fedadamom.metric_names import LOSS, TEST_ACCURACY, TEST_LOSS, TRAIN_ACCURACY, TRAIN_LOSS
from tff_fedadamom.metric_names import VALIDATION_ACCURACY, VALIDATION_LOSS, VALIDATION_PREFIX
from tff_fedadamom.naming import suggest
from tuning.checks import check_sweep
from tuning.errors import SweepConfigError
from tuning.space import Distribution, SpaceEntry, parse_distribution

__all__ = ["Budget", "Distribution", "Metric", "Resources", "SWEEP_FILE",
           "Scheduler", "Search", "SpaceEntry", "Sweep", "SweepConfigError", "dump_sweep",
           "load_sweep", "num_evaluations", "parse_sweep", "read_sweep_yaml",
           "sweep_to_dict"]

SEARCH_KINDS = ("random", "grid", "optuna")
SCHEDULER_KINDS = ("none", "asha")
MODES = ("max", "min")
METRICS = (TEST_ACCURACY, TEST_LOSS, VALIDATION_ACCURACY, VALIDATION_LOSS, TRAIN_ACCURACY,
           TRAIN_LOSS)
DEFAULT_STORAGE_PATH = "runs/sweeps"
SWEEP_FILE = "sweep.yaml"  # the validated sweep, kept in its directory

# The sections' fields are checked by the experiment config's engine
# (`build_section`); what depends on another section, in `parse_sweep`.
_EXPLICIT = "the budget must be explicit: it is what makes optimizers comparable"


@dataclasses.dataclass(frozen=True)
class Budget:
  """Trials per optimizer and rounds per trial: required, the same for every optimizer."""

  trials_per_optimizer: int = checked_field(check=positive, allowed="an integer >= 1",
                                            why=_EXPLICIT)
  rounds: int = checked_field(check=positive, allowed="an integer >= 1", why=_EXPLICIT)


@dataclasses.dataclass(frozen=True)
class Search:
  kind: str = checked_field("random", choices=SEARCH_KINDS)
  seed: int = checked_field(0, check=nonnegative, allowed="an integer >= 0")


@dataclasses.dataclass(frozen=True)
class Scheduler:
  """Early stopping: `none`, or ASHA (`grace_period` in [1, budget.rounds])."""

  kind: str = checked_field("none", choices=SCHEDULER_KINDS)
  grace_period: int = checked_field(1, check=positive,
                                    allowed="an integer number of rounds >= 1")
  reduction_factor: float = checked_field(2.0, check=lambda v: v > 1,
                                          allowed="a number > 1")


@dataclasses.dataclass(frozen=True)
class Metric:
  """The objective: `name` averaged over the last `last_k` evaluations (at most
  the evaluations of a trial); `mode` defaults to 'min' for a loss, else 'max'."""

  name: str = checked_field(TEST_ACCURACY, choices=METRICS)
  last_k: int = checked_field(1, check=positive, allowed="an integer >= 1")
  mode: Optional[str] = checked_field(None, choices=MODES)


def _local_path(path: str) -> bool:
  return bool(path) and "://" not in path


@dataclasses.dataclass(frozen=True)
class Resources:
  cpus_per_trial: float = checked_field(1.0, check=positive, allowed="a number > 0")
  gpus_per_trial: float = checked_field(
      0.0, check=ray_resource,
      allowed="0, a fraction of one GPU, or a whole number of GPUs")
  max_concurrent_trials: Optional[int] = checked_field(
      None, check=positive, allowed="an integer >= 1 or null")
  time_budget_s: Optional[float] = checked_field(None, check=positive,
                                                 allowed="seconds > 0 or null")
  address: Optional[str] = checked_field(
      None, check=ray_address, problem="not a Ray address",
      allowed="null (a local Ray on 127.0.0.1), 'auto' (the cluster this machine "
      "belongs to) or host:port of a cluster's head")
  storage_path: str = checked_field(
      DEFAULT_STORAGE_PATH, check=_local_path, problem="not a local path",
      allowed="a directory path; on a multi-node cluster, one that every node mounts "
      "at the same place")
  max_failures: int = checked_field(1, check=nonnegative,
                                    allowed="an integer >= 0 (restarts of a crashed trial)")


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A validated sweep: the file's sections with defaults filled, `source` the
  file it was read from ('<dict>' for a mapping), `base` the validated
  `ExperimentConfig`, and the space entries as written (`space` top-level,
  `space_by_optimizer` per optimizer)."""

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


def num_evaluations(rounds: int, eval_every: int) -> int:
  """How many evaluations a run of `rounds` makes (every `eval_every`, and the last)."""
  return rounds // eval_every + (1 if rounds % eval_every else 0)


def read_sweep_yaml(path: Union[str, os.PathLike]) -> Any:
  """Safe-loads a sweep file; every failure is a SweepConfigError naming it."""
  return read_yaml(path, what="sweep file", error=SweepConfigError)


def _section(cls, raw: Any, source: str, key: str):
  return build_section(cls, raw, source, key + ".", error=SweepConfigError,
                       by_prefix=True, string_numbers=True)[0]


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
  if base.runtime.backend == RAY:
    # A trial is one Ray task; its own actors would need a placement group.
    others = [repr(b) for b in BACKENDS if b != RAY]
    raise SweepConfigError(source, "base.runtime.backend",
                           f"the {RAY} backend does not run inside sweep trials yet",
                           value=RAY, allowed=", ".join(others[:-1]) + " or " + others[-1])
  return base


def _parse_optimizers(raw: Any, source: str) -> tuple:
  from tff_fedadamom.methods import list_optimizers

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
      raise SweepConfigError(source, f"optimizers[{i}]", "unknown server optimizer"
                             + suggest(name, valid, by_prefix=True), value=name,
                             allowed=", ".join(valid))
  if len(set(raw)) != len(raw):
    dup = next(n for n in raw if list(raw).count(n) > 1)
    raise SweepConfigError(source, "optimizers", "listed twice", value=dup)
  return tuple(raw)


_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _check_path_syntax(path: Any, source: str, field: str) -> None:
  if not isinstance(path, str) or not _PATH.match(path):
    raise SweepConfigError(source, field, "not a dotted experiment path", value=path,
                           allowed="e.g. server.learning_rate or client.learning_rate")
  if path in ("server.optimizer", "output_dir", "rounds", "name"):
    raise SweepConfigError(source, field, "set by the sweep itself and cannot be searched",
                           value=path, allowed="'optimizers' chooses the optimizer, "
                           "'budget.rounds' the rounds")


def _parse_space(raw: Any, source: str, optimizers: tuple):
  """(top-level entries, {optimizer: its entries}): dotted path -> SpaceEntry."""
  from tff_fedadamom.methods import list_optimizers

  raw = coerce({} if raw is None else raw, dict, source, "space", SweepConfigError)
  shared, by_optimizer = {}, {}
  registered = list_optimizers()
  for key, value in raw.items():
    if key in registered:
      sub = coerce({} if value is None else value, dict, source, f"space.{key}", SweepConfigError)
      by_optimizer[key] = {}
      for path, entry in sub.items():
        _check_path_syntax(path, source, f"space.{key}.{path}")
        by_optimizer[key][path] = parse_distribution(entry, source, f"space.{key}.{path}")
      continue
    if "." not in key:
      raise SweepConfigError(
          source, f"space.{key}", "neither a dotted experiment path nor an optimizer name"
          + suggest(key, registered, by_prefix=True),
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


def _check_scheduler(scheduler: Scheduler, raw: Any, source: str, budget: Budget
                     ) -> Scheduler:
  if scheduler.kind == "none":
    reject_unknown(raw or {}, ("kind",), source, "scheduler.", SweepConfigError)
    return Scheduler(kind="none")
  if scheduler.grace_period > budget.rounds:
    raise SweepConfigError(source, "scheduler.grace_period", "out of range",
                           value=scheduler.grace_period,
                           allowed=f"an integer number of rounds in [1, {budget.rounds}] "
                           "(budget.rounds)")
  return scheduler


def _check_metric(metric: Metric, source: str, evaluations: int, base) -> Metric:
  if metric.name.startswith(VALIDATION_PREFIX) and base.validation is None:
    raise SweepConfigError(source, "metric.name", "the base experiment holds out no "
                           "validation set", value=metric.name,
                           allowed="a test/ or train/ metric, or a base with a validation "
                           "section (base.validation.fraction)")
  if metric.last_k > evaluations:
    raise SweepConfigError(source, "metric.last_k", "out of range", value=metric.last_k,
                           allowed=f"an integer in [1, {evaluations}] (the evaluations in "
                           "budget.rounds at base.eval_every)")
  if metric.mode is None:
    metric = dataclasses.replace(metric, mode="min" if metric.name.endswith(LOSS)
                                 else "max")
  return metric


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def parse_sweep(raw: Any, source: str = "<dict>", base_dir: str = "") -> Sweep:
  """Builds and fully validates a `Sweep` from a plain mapping."""
  if not isinstance(raw, Mapping):
    raise SweepConfigError(source, "", "a sweep file must be a mapping of sections",
                           value=raw)
  reject_unknown(raw, TOP_LEVEL, source, "", SweepConfigError, by_prefix=True)
  default_name = (os.path.splitext(os.path.basename(source))[0]
                  if source != "<dict>" else "sweep")
  name = raw.get("name", default_name)
  if not isinstance(name, str) or not _NAME.match(name):
    raise SweepConfigError(source, "name", "not a usable directory name", value=name,
                           allowed="letters, digits, '_', '-', '.'")
  base = _parse_base(raw.get("base"), source, base_dir)
  optimizers = _parse_optimizers(raw.get("optimizers"), source)
  budget = _section(Budget, raw.get("budget"), source, "budget")
  space, by_optimizer = _parse_space(raw.get("space"), source, optimizers)
  search = _section(Search, raw.get("search"), source, "search")
  scheduler = _check_scheduler(_section(Scheduler, raw.get("scheduler"), source,
                                        "scheduler"), raw.get("scheduler"), source, budget)
  metric = _check_metric(_section(Metric, raw.get("metric"), source, "metric"), source,
                         num_evaluations(budget.rounds, base.eval_every), base)
  resources = _section(Resources, raw.get("resources"), source, "resources")
  sweep = Sweep(name=name, source=source, base=base, optimizers=optimizers, budget=budget,
                space=space, space_by_optimizer=by_optimizer, search=search,
                scheduler=scheduler, metric=metric, resources=resources)
  check_sweep(sweep)
  return sweep


def load_sweep(sweep: Union[str, os.PathLike, Mapping, Sweep],
               overrides: Iterable[str] = ()) -> Sweep:
  """Loads and validates a sweep: a YAML path, a plain mapping (a relative `base`
  path is then relative to the current directory), or a `Sweep` (as is), with
  dotted `key=value` `overrides` (values parsed as YAML, as `load_config`'s)."""
  overrides = list(overrides or ())
  if isinstance(sweep, Sweep) and not overrides:
    return sweep
  if isinstance(sweep, Sweep):  # its base inlined, so no directory to resolve it from
    raw, source, base_dir = sweep_to_dict(sweep), sweep.source, ""
  elif isinstance(sweep, Mapping):
    raw, source, base_dir = sweep, "<dict>", ""
  else:
    source = os.fspath(sweep)
    raw, base_dir = read_sweep_yaml(source), os.path.dirname(source)
  if overrides:
    if not isinstance(raw, Mapping):
      raise SweepConfigError(source, "", "a sweep file must be a mapping of sections",
                             value=raw)
    if source != "<dict>" and "name" not in raw:  # the file's stem, not the override's text
      raw = {"name": os.path.splitext(os.path.basename(source))[0], **raw}
    raw = apply_overrides(raw, overrides)
    source += " (with --set " + " ".join(overrides) + ")"
  return parse_sweep(raw, source, base_dir)


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
