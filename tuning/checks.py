"""The checks of a sweep that need the registries and the resolved spaces (run by
`tuning.schema.parse_sweep` after the file's own): every server hparam exists
for some listed optimizer, grids are fair, and every extreme value of every
dimension gives a valid experiment for every optimizer.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from tuning.errors import SweepConfigError
from tuning.space import Distribution, OptimizerSpace, experiment_dict, hparam_of, resolve

Sweep = Any  # a `tuning.schema.Sweep`: the schema calls these checks


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
  """Runs the checks the module docstring lists; raises SweepConfigError."""
  from tff_fedadamom.config import ConfigError, config_to_dict, load_config
  from tff_fedadamom.methods import default_hparams, sweepable_hparams

  base = config_to_dict(sweep.base)
  for path, entry in sweep.space.items():
    _check_parent(sweep, path, f"space.{path}", base)
    hparam = hparam_of(path)
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
      values = {**space.fixed, **params}
      shown = f"{culprit}={values[culprit]!r}" if culprit in values else "the space"
      raise SweepConfigError(
          sweep.source, field,
          f"{shown} gives an invalid experiment for optimizer {space.optimizer!r}"
          f"{_default_note(space, culprit)}: {named}: {str(e).split(': ', 2)[-1]}"
      ) from None


def _default_note(space: OptimizerSpace, path: Optional[str]) -> str:
  if path not in space.defaulted:
    return ""
  return " (a default range of tuning.space; override it under 'space' or set it to null)"
