"""Search spaces: from a sweep and the optimizer registry to Tune's search space.

Each optimizer's space is the merge, later winning, of

  1. the optimizer registry's search range for each of the optimizer's tunable
     hparams (`tff_fedadamom.optimizers.search_ranges`),
  2. `DEFAULT_SPACE` (the client learning rate's range from the literature),
  3. the sweep's top-level `space` entries,
  4. the sweep's `space.<optimizer>` entries,

keeping a `server.<hparam>` distribution only for the optimizers whose registry
entry lets a sweep vary `<hparam>` (`tff_fedadamom.optimizers.sweepable_hparams`:
the tunable hparams, which have default ranges, and bool switches such as
`bias_correction`, which a sweep varies only with an explicit
`{dist: choice, values: [true, false]}`). The registry is the only source of
which hparams exist; this module never decides that by optimizer name.

Defaults (the server ranges live in the optimizer registry, `search_ranges`):
  server.learning_rate  loguniform 1e-3..1e1  Reddi et al., "Adaptive Federated
  client.learning_rate  loguniform 1e-3..1e1  Optimization" (ICLR 2021), grids
                                              10^-3..10^1 for eta and eta_l
  server.epsilon        loguniform 1e-5..1e-1 the same paper's tau grid; FedAdamom's
                                              clip margin (reference 1e-3) lies inside
  server.beta_2         uniform 0.9..0.999    Adam-family second-moment decay (Reddi
                                              et al. fix 0.99)
  server.beta_2 (fedadamom) uniform 0.01..0.3 the FedAdamom paper's ablation range
  server.momentum       uniform 0.5..0.99     FedAvgM (Hsu et al. 2019: best 0.9-0.97)
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, Mapping, Optional

from tuning.schema import Distribution, Sweep, SweepConfigError

DEFAULT_SPACE: Mapping[str, Distribution] = {
    "client.learning_rate": Distribution("loguniform", low=1e-3, high=1e1),
}


def registry_space(optimizer: str) -> dict[str, Distribution]:
  """`server.<hparam>` -> the registry's literature range, per tunable hparam."""
  from tff_fedadamom.optimizers import search_ranges

  return {f"server.{h}": Distribution(dist, low=low, high=high)
          for h, (dist, low, high) in search_ranges(optimizer).items()}


@dataclasses.dataclass(frozen=True)
class OptimizerSpace:
  """The resolved space of one optimizer.

  Attributes:
    optimizer: Registry name.
    tuned: Dotted path -> Distribution, the dimensions Tune samples.
    fixed: Dotted path -> value, set in every trial of this optimizer.
    integer: Paths whose base value is an integer: uniform/loguniform draw
      integers there (bounds inclusive).
    fields: Dotted path -> the sweep field of the entry (for error messages).
    defaulted: Paths whose entry is one of this module's defaults.
  """

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


def _hparam_of(path: str) -> Optional[str]:
  """'server.beta_2' -> 'beta_2'; None for paths that are not server hparams."""
  parts = path.split(".")
  if parts[0] != "server" or len(parts) != 2 or parts[1] in _server_fields():
    return None
  return parts[1]


def _get(tree: Mapping, path: str):
  node = tree
  for key in path.split("."):
    if not isinstance(node, Mapping) or key not in node:
      raise KeyError(path)
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
  from tff_fedadamom.optimizers import default_hparams, sweepable_hparams

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
      hparam = _hparam_of(path)
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
      try:
        base_value = _get(base, path)
      except KeyError:
        base_value = None
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
  """The experiment config (a plain mapping) of one trial.

  The base experiment with: the optimizer switched to `optimizer` (hparams of
  another base optimizer dropped, so the registry's defaults apply), the budget's
  rounds, the space's fixed values, the sampled `params` (dotted path -> value),
  the trial's `output_dir` and `name`, and `threads` if given. `load_config`
  validates the result.
  """
  from tff_fedadamom.config import config_to_dict
  from tff_fedadamom.optimizers import default_hparams

  space = space or resolve(sweep, optimizer)
  tree = copy.deepcopy(config_to_dict(sweep.base))
  server = tree["server"]
  if server["optimizer"] != optimizer:
    for hparam in default_hparams(server["optimizer"]):
      server.pop(hparam, None)
    server["optimizer"] = optimizer
  tree["rounds"] = sweep.budget.rounds
  tree["output_dir"] = output_dir
  tree["name"] = name
  for path, value in {**space.fixed, **params}.items():
    set_path(tree, path, plain(value))
  if threads is not None:
    tree["runtime"]["threads"] = int(threads)
  return tree


def plain(value: Any) -> Any:
  """Numpy scalars (Tune's samples) -> Python numbers, for YAML and JSON."""
  item = getattr(value, "item", None)
  if callable(item) and not isinstance(value, (list, tuple, dict, str)):
    return item()
  return value


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


def _check_parent(sweep: Sweep, path: str, field: str, base: Mapping) -> None:
  keys = path.split(".")
  node = base
  for depth, key in enumerate(keys[:-1]):
    if not isinstance(node, Mapping) or not isinstance(node.get(key), Mapping):
      shown = ".".join(keys[:depth + 1])
      sections = sorted(k for k, v in (node.items() if isinstance(node, Mapping) else ())
                        if isinstance(v, Mapping))
      raise SweepConfigError(sweep.source, field, f"{shown!r} is not a section of the "
                             "experiment config", value=path,
                             allowed="paths under " + ", ".join(sections))
    node = node[key]
  if isinstance(node.get(keys[-1]), Mapping):
    raise SweepConfigError(sweep.source, field, "is a whole section, not a value",
                           value=path, allowed=f"a path below it, e.g. {path}.<key>")


def check_sweep(sweep: Sweep) -> None:
  """Checks what needs the registries: server hparams exist for some listed
  optimizer, grids are fair, and every extreme value of every dimension gives a
  valid experiment for every optimizer. Raises SweepConfigError."""
  from tff_fedadamom.config import ConfigError, config_to_dict, load_config
  from tff_fedadamom.optimizers import default_hparams, sweepable_hparams

  base = config_to_dict(sweep.base)
  for path, entry in sweep.space.items():
    _check_parent(sweep, path, f"space.{path}", base)
    hparam = _hparam_of(path)
    if hparam is None or entry is None:
      continue
    is_dist = isinstance(entry, Distribution)
    owners = [o for o in sweep.optimizers
              if hparam in (sweepable_hparams(o) if is_dist else default_hparams(o))]
    if not owners:
      offered = sorted({h for o in sweep.optimizers
                        for h in (sweepable_hparams(o) if is_dist else default_hparams(o))})
      raise SweepConfigError(
          sweep.source, f"space.{path}",
          f"no optimizer in {list(sweep.optimizers)} has the "
          f"{'tunable ' if is_dist else ''}hparam {hparam!r}",
          allowed=", ".join(f"server.{h}" for h in offered))
  for optimizer, entries in sweep.space_by_optimizer.items():
    for path in entries:
      _check_parent(sweep, path, f"space.{optimizer}.{path}", base)

  kind = sweep.search.kind
  for optimizer in sweep.optimizers:
    space = resolve(sweep, optimizer)
    for path, dist in space.tuned.items():
      field = space.fields[path]
      if kind == "grid" and dist.dist != "grid":
        raise SweepConfigError(
            sweep.source, field, f"search.kind 'grid' needs every tuned dimension of "
            f"{optimizer!r} to be a grid{_default_note(space, path)}",
            value=f"{path}: {dist.dist}",
            allowed="{dist: grid, values: [...]}, a fixed value, or null (not tuned)")
      if kind != "grid" and dist.dist == "grid":
        raise SweepConfigError(
            sweep.source, field, f"'grid' only goes with search.kind: grid (with "
            f"{kind!r} it would multiply the trials and break the equal budget)",
            value=path, allowed="loguniform, uniform, choice")
      if path in space.integer and dist.dist in ("uniform", "loguniform") and not (
          float(dist.low).is_integer() and float(dist.high).is_integer()):
        raise SweepConfigError(sweep.source, field, "bounds of an integer field must be "
                               "integers", value=(dist.low, dist.high))
    if kind == "grid" and space.grid_size() != sweep.budget.trials_per_optimizer:
      dims = ", ".join(f"{p} ({len(d.values)})" for p, d in space.tuned.items()) or "none"
      raise SweepConfigError(
          sweep.source, "budget.trials_per_optimizer",
          f"the grid of {optimizer!r} has {space.grid_size()} points (dimensions: {dims}); "
          "every optimizer must get the same number of trials",
          value=sweep.budget.trials_per_optimizer,
          allowed="grids of exactly trials_per_optimizer points for every optimizer "
          "(fix or drop dimensions with a value or null)")
    _check_values(sweep, space, load_config, ConfigError)


def _check_values(sweep: Sweep, space: OptimizerSpace, load_config, config_error) -> None:
  """Builds the experiment at each extreme value of each dimension (the others
  at their first extreme) and validates it."""
  lows = {p: d.extremes()[0] for p, d in space.tuned.items()}
  probes = [(None, lows)]
  for path, dist in space.tuned.items():
    for value in dist.extremes():
      probes.append((path, {**lows, path: value}))
  for path, params in probes:
    tree = experiment_dict(sweep, space.optimizer, params, output_dir="probe",
                           space=space)
    try:
      load_config(tree)
    except config_error as e:
      named = getattr(e, "field", "")
      culprit = named if named in params else path
      if culprit is None:
        culprit = named if named in space.fixed else None
      field = space.fields.get(culprit, "space") if culprit else "space"
      shown = (f"{culprit}={params[culprit]!r}" if culprit in params
               else f"{culprit}={space.fixed[culprit]!r}" if culprit in space.fixed
               else "the space")
      raise SweepConfigError(
          sweep.source, field,
          f"{shown} gives an invalid experiment for optimizer {space.optimizer!r}"
          f"{_default_note(space, culprit)}: {named}: {str(e).split(': ', 2)[-1]}"
      ) from None


def _default_note(space: OptimizerSpace, path: Optional[str]) -> str:
  if path in space.defaulted:
    return (" (a default range of tuning.space; override it under 'space' or set it "
            "to null)")
  return ""
