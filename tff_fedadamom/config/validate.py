"""Checks names and their options by asking the registries (the only place that
knows which datasets, models, optimizers and schedules exist)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping

from tff_fedadamom.config import schema
from tff_fedadamom.config.errors import ConfigError
from tff_fedadamom.config.sections import reject_unknown
from tff_fedadamom.naming import suggest


def _check_name(name, valid, source, field):
  valid = list(valid)
  if name not in valid:
    raise ConfigError(source, field, "unknown name" + suggest(name, valid),
                      value=name, allowed=", ".join(valid))


def _check_options(options: Mapping, defaults: Mapping, source: str, prefix: str) -> None:
  """Options must be known and of a type compatible with their default."""
  reject_unknown(options, defaults, source, prefix)
  for key, value in options.items():
    default = defaults[key]
    allowed = None if default is None or value is None else _unlike(default, value)
    if allowed:
      raise ConfigError(source, prefix + key, "wrong type", value=value, allowed=allowed)


def _unlike(default, value) -> str | None:
  """What an option must be to stand where `default` does, or None if `value` may."""
  if isinstance(default, bool) != isinstance(value, bool):
    return f"like the default {default!r}"
  if isinstance(default, (int, float)) and not isinstance(default, bool):
    if not isinstance(value, (int, float)) or not math.isfinite(value):
      return f"a finite number like the default {default!r}"
    if isinstance(default, int) and isinstance(value, float) and not value.is_integer():
      return f"an integer like the default {default!r}"
  elif isinstance(default, str) and not isinstance(value, str):
    return f"a string like the default {default!r}"
  elif isinstance(default, (list, tuple)) and not isinstance(value, (list, tuple)):
    return f"a list like the default {list(default)!r}"
  return None


def _check_data(data: schema.DataConfig, source: str) -> schema.DataConfig:
  """Checks the data section; returns it with the partition's kind named."""
  from tff_fedadamom.data import DATASETS, PARTITIONERS

  _check_name(data.name, DATASETS, source, "data.name")
  spec = DATASETS[data.name]
  _check_options(data.options, spec.options, source, "data.options.")
  if spec.needs_path and not data.path:
    raise ConfigError(source, "data.path", f"data set {data.name!r} needs local files",
                      allowed=f"the directory holding them ({spec.source})")
  kind, partition = schema.split_kind(data.partition, schema.DEFAULT_PARTITION_KIND)
  data = dataclasses.replace(data, partition={"kind": kind, **partition})
  if spec.natural_clients:
    return data
  _check_name(kind, PARTITIONERS, source, "data.partition.kind")
  _check_options(partition, PARTITIONERS[kind].options, source, "data.partition.")
  for key, value in partition.items():
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
      raise ConfigError(source, f"data.partition.{key}", "out of range", value=value,
                        allowed="a number > 0")
  return data


def _field_error(error: ValueError, source: str, section: str, values: Mapping) -> ConfigError:
  """A registry's ValueError as a ConfigError on the argument it names in backticks."""
  match = re.search(r"`(\w+)`", str(error))
  name = match.group(1) if match else None
  return ConfigError(source, f"{section}.{name}" if name else section, str(error),
                     value=values.get(name))


def _check_server(server: schema.ServerConfig, source: str) -> schema.ServerConfig:
  from tff_fedadamom import methods

  _check_name(server.optimizer, methods.list_optimizers(), source, "server.optimizer")
  defaults = methods.default_hparams(server.optimizer)
  valid_keys = list(defaults) + [f.name for f in dataclasses.fields(server)
                                 if f.name != "hparams"]
  for key in server.hparams:
    if key not in defaults:
      raise ConfigError(
          source, f"server.{key}",
          f"unknown key for optimizer {server.optimizer!r}" + suggest(key, valid_keys),
          allowed=", ".join(valid_keys))
  hparams = {}
  for key, value in server.hparams.items():
    switch = isinstance(defaults[key], bool)
    if switch and not isinstance(value, bool):
      # A switch such as bias_correction: YAML true/false only (not 0/1, not "no").
      raise ConfigError(source, f"server.{key}", "wrong type", value=value,
                        allowed="true or false")
    if not switch and (isinstance(value, bool) or not isinstance(value, (int, float))
                       or not math.isfinite(value)):
      raise ConfigError(source, f"server.{key}", "wrong type", value=value,
                        allowed="a finite number")
    hparams[key] = value if switch else float(value)
  try:
    resolved = methods.check_hparams(server.optimizer, **hparams)  # defaults filled in
  except ValueError as e:
    raise _field_error(e, source, "server", hparams) from None
  return dataclasses.replace(server, hparams=resolved,
                             schedule=_check_schedule(server.schedule, source))


def _check_schedule(schedule: Mapping[str, Any], source: str) -> dict:
  """Checks the schedule against its registry entry's ranges (the checks
  `build_schedule` runs, without building one); returns it with its kind named."""
  from tff_fedadamom.optimizers import schedules

  kind, params = schema.split_kind(schedule, schema.DEFAULT_SCHEDULE_KIND)
  _check_name(kind, schedules.SCHEDULES, source, "server.schedule.kind")
  _check_options(params, schedules.SCHEDULES[kind].defaults, source, "server.schedule.")
  try:
    schedules.resolve_schedule_params(kind, **params)
  except ValueError as e:
    raise _field_error(e, source, "server.schedule", params) from None
  return {"kind": kind, **params}


def _check_learning_process(config: schema.ExperimentConfig, source: str) -> None:
  """Options a whole learning process (FedCAda, FAFED) has no use for are errors."""
  from tff_fedadamom import methods

  name = config.server.optimizer
  if not methods.is_learning_process(name):
    return
  if config.client.momentum:
    raise ConfigError(source, "client.momentum",
                      f"{name!r} runs its own client rule (no client SGD momentum)",
                      value=config.client.momentum, allowed="0")
  constant = schema.DEFAULT_SCHEDULE_KIND
  if schema.split_kind(config.server.schedule, constant)[0] != constant:
    raise ConfigError(source, "server.schedule",
                      f"{name!r} has no server optimizer to schedule",
                      value=dict(config.server.schedule), allowed=f"{{kind: {constant}}}")


def _check_kind(options: Mapping, kinds: Mapping, default: str, source: str,
                field: str) -> dict:
  """A `{kind: ..., <options>}` mapping checked against `kinds` (kind -> option
  defaults): every option filled in, each number > 0 (`jitter` and `b`: >= 0)."""
  kind, params = schema.split_kind(options, default)
  _check_name(kind, kinds, source, f"{field}.kind")
  _check_options(params, kinds[kind], source, f"{field}.")
  params = {**kinds[kind], **params}
  for key, value in params.items():
    low_ok = key in ("jitter", "b")
    if value < 0 or (value == 0 and not low_ok):
      raise ConfigError(source, f"{field}.{key}", "out of range", value=value,
                        allowed="a number >= 0" if low_ok else "a number > 0")
  return {"kind": kind, **params}


def _check_asynchronous(config: schema.ExperimentConfig, source: str):
  """The `asynchronous` section with its nulls and kinds resolved (None: none)."""
  from tff_fedadamom import asynchrony, methods

  section = config.asynchronous
  if section is None:
    return None
  name = config.server.optimizer
  if methods.is_learning_process(name):
    servers = [m for m in methods.list_optimizers() if not methods.is_learning_process(m)]
    raise ConfigError(source, "asynchronous", f"{name!r} is a learning process of its own "
                      "(its clients keep state); buffered asynchronous steps need a server "
                      "optimizer", value=name, allowed=f"server.optimizer in {servers}")
  if schema.resolved_backend(config.runtime) == schema.TFF_CPP:
    raise ConfigError(source, "runtime.backend", "asynchronous steps run on the in-process "
                      "or ray backend", value=config.runtime.backend,
                      allowed=f"{schema.INPROCESS!r}, {schema.AUTO!r} or {schema.RAY!r}")
  buffer_size = section.buffer_size or config.clients_per_round
  concurrency = section.concurrency or buffer_size
  if config.data.num_clients is not None and concurrency > config.data.num_clients:
    raise ConfigError(source, "asynchronous.concurrency", "more than data.num_clients",
                      value=concurrency, allowed=f"an integer in [1, {config.data.num_clients}]")
  durations = _check_kind(section.durations, asynchrony.DURATIONS,
                          asynchrony.DEFAULT_DURATIONS["kind"], source, "asynchronous.durations")
  staleness = _check_kind(section.staleness, asynchrony.STALENESS,
                          asynchrony.DEFAULT_STALENESS["kind"], source, "asynchronous.staleness")
  if staleness["kind"] == "hinge" and not float(staleness["b"]).is_integer():
    raise ConfigError(source, "asynchronous.staleness.b", "wrong type", value=staleness["b"],
                      allowed="an integer >= 0 (server steps)")
  return dataclasses.replace(section, buffer_size=buffer_size, concurrency=concurrency,
                             durations=durations, staleness=staleness)


RAY_FIELDS = ("workers", "cpus_per_worker", "gpus_per_worker", "address")


def _check_runtime(runtime: schema.RuntimeConfig, source: str) -> None:
  backend = schema.resolved_backend(runtime)
  inprocess, ray = schema.INPROCESS, schema.RAY
  if backend != inprocess and runtime.devices is not None:
    problem = (f"the {backend} backend runs every round in TFF's worker_binary, on its CPU"
               if backend == schema.TFF_CPP else f"the {ray} backend's actors use the "
               "devices Ray gives them (runtime.gpus_per_worker)")
    raise ConfigError(source, "runtime.devices", problem, value=list(runtime.devices),
                      allowed=f"null with backend {backend!r}, or backend {inprocess!r}")
  if backend != ray:
    for name in RAY_FIELDS:
      if getattr(runtime, name) is not None:
        raise ConfigError(source, f"runtime.{name}", f"belongs to the {ray} backend",
                          value=getattr(runtime, name),
                          allowed=f"null with backend {runtime.backend!r}, or backend {ray!r}")


def check_registries(config: schema.ExperimentConfig, source: str) -> schema.ExperimentConfig:
  """Validates every registry name and option; returns the config with the
  server hparams resolved against the optimizer's defaults and the partition's
  and schedule's kinds named."""
  from tff_fedadamom.models import MODELS

  data = _check_data(config.data, source)
  model = config.model
  _check_name(model.name, MODELS, source, "model.name")
  _check_options(model.options, MODELS[model.name].options, source, "model.options.")
  server = _check_server(config.server, source)
  _check_learning_process(config, source)
  _check_runtime(config.runtime, source)
  if config.data.num_clients is not None and config.clients_per_round > config.data.num_clients:
    raise ConfigError(source, "clients_per_round", "more than data.num_clients",
                      value=config.clients_per_round,
                      allowed=f"an integer in [1, {config.data.num_clients}]")
  return dataclasses.replace(config, data=data, server=server,
                             asynchronous=_check_asynchronous(config, source))
