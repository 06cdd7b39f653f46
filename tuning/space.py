"""Search spaces: from a sweep and the optimizer registry to Tune's search space.

A space entry is a `Distribution`, a fixed value, or null. Each optimizer's
space is the merge, later winning, of

  1. the optimizer registry's search range for each of the optimizer's tunable
     hparams (`tff_fedadamom.methods.search_ranges`),
  2. `DEFAULT_SPACE` (the client learning rate's range from the literature),
  3. the sweep's top-level `space` entries,
  4. the sweep's `space.<optimizer>` entries,

keeping a `server.<hparam>` distribution only for the optimizers whose registry
entry lets a sweep vary `<hparam>` (`tff_fedadamom.methods.sweepable_hparams`;
a bool switch such as `bias_correction` only with explicit values).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import zlib
from typing import Any, Mapping, Optional, Union

from tff_fedadamom.config.sections import coerce, reject_numeric_string, reject_unknown
from tff_fedadamom.naming import suggest
from tff_fedadamom.plain import plain
from tuning.errors import SweepConfigError

Sweep = Any  # a `tuning.schema.Sweep`: the schema builds on this module

DISTRIBUTIONS = ("loguniform", "uniform", "choice", "grid")


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


def parse_distribution(raw: Any, source: str, field: str) -> SpaceEntry:
  """A space entry: mapping with `dist` -> Distribution; scalar -> fixed; None.
  A tagged union (the keys depend on `dist`), so not read by `build_section`."""
  if not isinstance(raw, Mapping):
    reject_numeric_string(raw, source, field, SweepConfigError)
    if isinstance(raw, (list, tuple)):
      raise SweepConfigError(source, field, "a list is ambiguous", value=raw,
                             allowed="{dist: choice, values: [...]} or "
                             "{dist: grid, values: [...]}")
    return raw
  raw = coerce(raw, dict, source, field, SweepConfigError)
  if "dist" not in raw:
    raise SweepConfigError(source, f"{field}.dist", "missing",
                           allowed=", ".join(DISTRIBUTIONS))
  dist = raw["dist"]
  if dist not in DISTRIBUTIONS:
    raise SweepConfigError(source, f"{field}.dist", "unknown value"
                           + suggest(dist, DISTRIBUTIONS, by_prefix=True), value=dist,
                           allowed=", ".join(DISTRIBUTIONS))
  if dist in ("loguniform", "uniform"):
    reject_unknown(raw, ("dist", "low", "high"), source, f"{field}.", SweepConfigError,
                   by_prefix=True)
    bounds = []
    for key in ("low", "high"):
      if key not in raw:
        raise SweepConfigError(source, f"{field}.{key}", f"missing for {dist}",
                               allowed="a finite number")
      bounds.append(coerce(raw[key], float, source, f"{field}.{key}", SweepConfigError,
                           string_numbers=True))
    low, high = bounds
    if dist == "loguniform" and low <= 0:
      raise SweepConfigError(source, f"{field}.low", "out of range for loguniform",
                             value=raw["low"], allowed="a number > 0")
    if high <= low:
      raise SweepConfigError(source, f"{field}.high", "must be greater than low",
                             value=raw["high"], allowed=f"a number > {raw['low']}")
    return Distribution(dist, low=low, high=high)
  reject_unknown(raw, ("dist", "values"), source, f"{field}.", SweepConfigError,
                 by_prefix=True)
  values = raw.get("values")
  if not isinstance(values, (list, tuple)) or not values:
    raise SweepConfigError(source, f"{field}.values", f"must be a non-empty list for {dist}",
                           value=values)
  for i, value in enumerate(values):
    if isinstance(value, (Mapping, list, tuple)) or value is None:
      raise SweepConfigError(source, f"{field}.values[{i}]", "wrong type", value=value,
                             allowed="a number, string or true/false")
    reject_numeric_string(value, source, f"{field}.values[{i}]", SweepConfigError)
  return Distribution(dist, values=tuple(values))


# Reddi et al., "Adaptive Federated Optimization" (ICLR 2021): eta_l on 10^-3..10^1.
DEFAULT_SPACE: Mapping[str, Distribution] = {
    "client.learning_rate": Distribution("loguniform", low=1e-3, high=1e1),
}


def registry_space(optimizer: str) -> dict[str, Distribution]:
  """`server.<hparam>` -> the registry's literature range, per tunable hparam."""
  from tff_fedadamom.methods import search_ranges

  return {f"server.{h}": Distribution(dist, low=low, high=high)
          for h, (dist, low, high) in search_ranges(optimizer).items()}


@dataclasses.dataclass(frozen=True)
class OptimizerSpace:
  """The resolved space of one optimizer: dotted path -> the Distribution Tune
  samples (`tuned`) or a value every trial sets (`fixed`); the paths whose base
  value is an integer, where uniform/loguniform draw integers (bounds
  inclusive); each entry's sweep field; the paths whose entry is a default."""

  optimizer: str
  tuned: Mapping[str, Distribution]
  fixed: Mapping[str, Any]
  integer: frozenset
  fields: Mapping[str, str]
  defaulted: frozenset = frozenset()

  def grid_size(self) -> int:
    return math.prod(len(d.values) for d in self.tuned.values() if d.dist == "grid")


def _server_fields() -> set:
  from tff_fedadamom.config import ServerConfig

  return {f.name for f in dataclasses.fields(ServerConfig)} - {"hparams"}


def hparam_of(path: str) -> Optional[str]:
  """'server.beta_2' -> 'beta_2'; None for paths that are not server hparams."""
  parts = path.split(".")
  if parts[0] != "server" or len(parts) != 2 or parts[1] in _server_fields():
    return None
  return parts[1]


def _get(tree: Mapping, path: str):
  """The value at dotted `path` in `tree`, None if there is none."""
  node = tree
  for key in path.split("."):
    if not isinstance(node, Mapping) or key not in node:
      return None
    node = node[key]
  return node


def set_path(tree: dict, path: str, value: Any) -> None:
  """Sets `tree[a][b]... = value` for the dotted `path`, creating no sections."""
  keys = path.split(".")
  node = tree
  for depth, key in enumerate(keys[:-1]):
    child = node.get(key) if isinstance(node, dict) else None
    if not isinstance(child, dict):
      raise KeyError(".".join(keys[:depth + 1]))
    node = child
  node[keys[-1]] = value


def resolve(sweep: Sweep, optimizer: str) -> OptimizerSpace:
  """The space of `optimizer` in `sweep` (see the module docstring)."""
  from tff_fedadamom.config import config_to_dict
  from tff_fedadamom.methods import default_hparams, sweepable_hparams

  sweepable = set(sweepable_hparams(optimizer))
  known = set(default_hparams(optimizer))
  layers = (
      (registry_space(optimizer), lambda p: f"space.{p}", False, True),
      (DEFAULT_SPACE, lambda p: f"space.{p}", False, True),
      (sweep.space, lambda p: f"space.{p}", False, False),
      (sweep.space_by_optimizer.get(optimizer, {}), lambda p: f"space.{optimizer}.{p}",
       True, False),
  )
  merged: dict[str, tuple[Any, str, bool]] = {}
  for entries, field_of, strict, is_default in layers:
    for path, entry in entries.items():
      hparam = hparam_of(path)
      if hparam is not None:
        is_dist = isinstance(entry, Distribution)
        applies = hparam in sweepable if is_dist else hparam in known or entry is None
        if not applies:
          if strict:
            allowed = sorted(sweepable) if is_dist else sorted(known)
            raise SweepConfigError(
                sweep.source, field_of(path),
                f"optimizer {optimizer!r} has no {'tunable ' if is_dist else ''}hparam "
                f"{hparam!r}", allowed=", ".join(f"server.{h}" for h in allowed))
          continue
      merged[path] = (entry, field_of(path), is_default)
  base = config_to_dict(sweep.base)
  tuned, fixed, integer, fields, defaulted = {}, {}, set(), {}, set()
  for path, (entry, field, is_default) in merged.items():
    if entry is None:
      continue
    fields[path] = field
    if is_default:
      defaulted.add(path)
    if isinstance(entry, Distribution):
      tuned[path] = entry
      base_value = _get(base, path)
      if isinstance(base_value, int) and not isinstance(base_value, bool):
        integer.add(path)
    else:
      fixed[path] = entry
  return OptimizerSpace(optimizer, tuned, fixed, frozenset(integer), fields,
                        frozenset(defaulted))


def experiment_dict(sweep: Sweep, optimizer: str, params: Mapping[str, Any], *,
                    output_dir: str, name: Optional[str] = None,
                    threads: Optional[int] = None,
                    space: Optional[OptimizerSpace] = None) -> dict:
  """The experiment config (a plain mapping) of one trial: the base with the
  optimizer switched to `optimizer` (another optimizer's hparams dropped), the
  budget's rounds, the space's fixed values, the sampled `params` (dotted path
  -> value), `output_dir`, `name`, and `threads` if given."""
  from tff_fedadamom.config import config_to_dict
  from tff_fedadamom.experiment.compare import with_optimizer

  space = space or resolve(sweep, optimizer)
  tree = with_optimizer(copy.deepcopy(config_to_dict(sweep.base)), optimizer)
  tree["rounds"] = sweep.budget.rounds
  tree["output_dir"] = output_dir
  tree["name"] = name
  for path, value in {**space.fixed, **params}.items():
    set_path(tree, path, plain(value))
  if threads is not None:
    tree["runtime"]["threads"] = int(threads)
  return tree


def tune_space(space: OptimizerSpace) -> dict:
  """Tune's search space (dotted path -> domain) for one optimizer."""
  from ray import tune

  out = {}
  for path, dist in space.tuned.items():
    if dist.dist == "loguniform":
      out[path] = (tune.lograndint(int(dist.low), int(dist.high) + 1)
                   if path in space.integer else tune.loguniform(dist.low, dist.high))
    elif dist.dist == "uniform":
      out[path] = (tune.randint(int(dist.low), int(dist.high) + 1)
                   if path in space.integer else tune.uniform(dist.low, dist.high))
    elif dist.dist == "choice":
      out[path] = tune.choice(list(dist.values))
    else:
      out[path] = tune.grid_search(list(dist.values))
  return out


def dimension_seed(search_seed: int, path: str) -> int:
  """The seed of dimension `path`'s draws in a sweep searched with
  `search_seed`: stable across processes and Python versions (not `hash`)."""
  return zlib.crc32(f"{int(search_seed)}:{path}".encode())


def sample_trials(sweep: Sweep, optimizer: str) -> list[dict]:
  """`optimizer`'s trials of a random or grid sweep, each a dotted path -> value.

  Random search: `budget.trials_per_optimizer` draws per dimension from Tune's
  domains (`tune_space`), each dimension with a numpy generator seeded by
  `dimension_seed(search.seed, path)`. So optimizers that share a dimension draw
  the same values for it, trial by trial (common random numbers: a comparison
  of two optimizers is not also one of their luck), whatever else the sweep
  holds, in any process. Grid search: every point, the last dimension fastest.
  """
  import numpy as np

  space = resolve(sweep, optimizer)
  if sweep.search.kind == "grid":
    paths = list(space.tuned)
    return [dict(zip(paths, point)) for point in
            itertools.product(*(space.tuned[p].values for p in paths))]
  if sweep.search.kind != "random":
    raise ValueError(f"sample_trials: search.kind {sweep.search.kind!r} proposes its own "
                     "trials (allowed: random, grid)")
  count = sweep.budget.trials_per_optimizer
  columns = {}
  for path, domain in tune_space(space).items():
    rng = np.random.RandomState(dimension_seed(sweep.search.seed, path))
    columns[path] = [plain(domain.sample(random_state=rng)) for _ in range(count)]
  return [{path: values[i] for path, values in columns.items()} for i in range(count)]
