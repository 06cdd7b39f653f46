"""YAML -> validated `ExperimentConfig`, dotted overrides, and the way back to YAML.

Loading happens once: types and ranges are checked against the schema, names
and their options against the registries, and the first problem raises a
`ConfigError` naming the file, the field, the value and what is allowed. YAML is
read with `yaml.safe_load`, so Python object tags are refused.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from typing import Any, Iterable, Mapping, Optional, Union

import yaml

from tff_fedadamom.config import schema
from tff_fedadamom.config.errors import ConfigError
from tff_fedadamom.atomic_io import atomic_write_text
from tff_fedadamom.naming import suggest
from tff_fedadamom.plain import plain


def _type_name(tp) -> str:
  names = {int: "an integer", float: "a number", str: "a string", bool: "true/false",
           dict: "a mapping", tuple: "a list"}
  return names.get(tp, getattr(tp, "__name__", str(tp)))


def numeric_string(value: Any) -> bool:
  """A string YAML 1.1 did not read as a number, such as '1e-3' or '1.0e38'."""
  if not isinstance(value, str):
    return False
  try:
    float(value)
  except ValueError:
    return False
  return True


def reject_numeric_string(value: Any, source: str, path: str,
                          error: type = ConfigError) -> None:
  """Raises `error` explaining YAML 1.1's exponent rule if `value` is a number
  that YAML read as a string."""
  if numeric_string(value):
    raise error(source, path, "YAML read this as a string, not a number", value=value,
                allowed="a number with a dot and a signed exponent, e.g. 1.0e-3 or 1.0e+38")


def coerce(value, tp, source: str, path: str, error: type = ConfigError, *,
           string_numbers: bool = False):
  """Checks `value` against the annotation `tp`; returns it in canonical form.

  Raises `error` (ConfigError or a subclass) naming `source` and `path`; with
  `string_numbers`, a number YAML read as a string ('1e-3') gets its own message.
  """
  origin = typing.get_origin(tp)
  if origin is Union:  # Optional[X]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if value is None:
      return None
    return coerce(value, args[0], source, path, error, string_numbers=string_numbers)
  if value is None:
    raise error(source, path, "must not be null", allowed=_type_name(tp))
  if string_numbers and tp in (int, float):
    reject_numeric_string(value, source, path, error)
  if tp is bool:
    if not isinstance(value, bool):
      raise error(source, path, "wrong type", value=value, allowed="true or false")
    return value
  if tp is int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
      raise error(source, path, "wrong type", value=value, allowed="an integer")
    return int(value)
  if tp is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise error(source, path, "wrong type", value=value, allowed="a number")
    if not math.isfinite(value):
      raise error(source, path, "must be finite", value=value, allowed="a finite number")
    return float(value)
  if tp is str:
    if not isinstance(value, str):
      raise error(source, path, "wrong type", value=value, allowed="a string")
    return value
  if tp is dict:
    if not isinstance(value, Mapping):
      raise error(source, path, "wrong type", value=value, allowed="a mapping")
    for key in value:
      if not isinstance(key, str):
        raise error(source, f"{path}.{key}", "keys must be strings", value=key)
    return dict(value)
  if tp is tuple:
    if not isinstance(value, (list, tuple)):
      raise error(source, path, "wrong type", value=value, allowed="a list")
    return tuple(value)
  raise TypeError(f"unsupported schema type {tp!r} at {path}")  # pragma: no cover


def reject_unknown(raw: Mapping, valid: Iterable[str], source: str, prefix: str,
                   error: type = ConfigError, *, by_prefix: bool = False) -> None:
  valid = list(valid)
  for key in raw:
    if key not in valid:
      hint = suggest(key, valid, by_prefix=by_prefix)
      raise error(
          source, f"{prefix}{key}", "unknown key" + (f", {hint}" if hint else ""),
          allowed=", ".join(valid))


def _required(field: dataclasses.Field) -> bool:
  return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def build_section(cls, raw: Any, source: str, prefix: str, *, extra_ok: bool = False,
                  error: type = ConfigError, by_prefix: bool = False,
                  string_numbers: bool = False):
  """Builds dataclass `cls` from mapping `raw`; returns (instance, leftover keys).

  Each field is checked against its annotation and the checks in its metadata
  (`schema.checked_field`); a field whose type is a dataclass is a nested section,
  built the same way. A field without a default is required. Every problem raises
  `error` (ConfigError or a subclass); `by_prefix` widens the 'did you mean'
  hints of unknown keys (see `suggest`), `string_numbers` explains numbers YAML
  read as strings (see `coerce`).
  """
  if raw is None:
    raw = {}
  if not isinstance(raw, Mapping):
    raise error(source, prefix.rstrip("."), "must be a mapping", value=raw)
  hints = typing.get_type_hints(cls)
  fields = dataclasses.fields(cls)
  names = [f.name for f in fields]
  if not extra_ok:
    reject_unknown(raw, names, source, prefix, error, by_prefix=by_prefix)
  kwargs = {}
  for field in fields:
    name, path, meta = field.name, prefix + field.name, field.metadata
    if name not in raw:
      if _required(field):
        why = meta.get("why")
        raise error(source, path, "missing" + (f" ({why})" if why else ""),
                    allowed=meta.get("allowed"))
      continue
    if dataclasses.is_dataclass(hints[name]):
      kwargs[name] = build_section(hints[name], raw[name], source, path + ".", error=error,
                                   by_prefix=by_prefix, string_numbers=string_numbers)[0]
      continue
    value = coerce(raw[name], hints[name], source, path, error,
                   string_numbers=string_numbers)
    choices = meta.get("choices")
    if value is not None and choices is not None and value not in choices:
      hint = suggest(value, choices, by_prefix=by_prefix)
      raise error(source, path, "unknown value" + (f", {hint}" if hint else ""),
                  value=value, allowed=meta.get("allowed") or ", ".join(choices))
    check = meta.get("check")
    if value is not None and check is not None and not check(value):
      raise error(source, path, meta.get("problem") or "out of range", value=value,
                  allowed=meta.get("allowed"))
    kwargs[name] = value
  leftover = {k: v for k, v in raw.items() if k not in names}
  return cls(**kwargs), leftover


def _server_section(raw: Any, source: str) -> schema.ServerConfig:
  server, leftover = build_section(schema.ServerConfig, raw, source, "server.", extra_ok=True)
  if "hparams" in (raw or {}):
    raise ConfigError(source, "server.hparams", "write the optimizer's hparams directly "
                      "under 'server' (e.g. server.learning_rate)")
  return dataclasses.replace(server, hparams=leftover)


def parse_config(raw: Any, source: str = "<dict>") -> schema.ExperimentConfig:
  """Builds and fully validates an `ExperimentConfig` from a plain mapping."""
  if not isinstance(raw, Mapping):
    raise ConfigError(source, "", "the config must be a mapping of sections", value=raw)
  raw = dict(raw)
  server_raw = raw.pop("server", None)
  config, _ = build_section(schema.ExperimentConfig, raw, source, "")
  config = dataclasses.replace(config, server=_server_section(server_raw, source))
  for i, target in enumerate(config.targets):
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not (
        0 < target <= 1):
      raise ConfigError(source, f"targets[{i}]", "out of range", value=target,
                        allowed="accuracies in (0, 1]")
  from tff_fedadamom.config import validate  # registries: imported only when needed

  return validate.check_registries(config, source)


class _UniqueKeyLoader(yaml.SafeLoader):
  """`yaml.SafeLoader` that refuses duplicate keys instead of keeping the last one."""


def _construct_mapping(loader, node, deep=False):
  seen = set()
  for key_node, _ in node.value:
    key = loader.construct_object(key_node, deep=deep)
    if key in seen:
      raise yaml.constructor.ConstructorError(
          None, None, f"duplicate key {key!r}", key_node.start_mark)
    seen.add(key)
  return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _construct_mapping)


def read_yaml(path: Union[str, os.PathLike], *, what: str = "config file",
              error: type = ConfigError) -> Any:
  """Safe-loads a YAML file (no Python tags, no duplicate keys); every failure is
  an `error` (a ConfigError) naming the file."""
  source = str(path)
  if not os.path.isfile(path):
    raise error(source, "", f"{what} not found", allowed="a path to an existing YAML file")
  try:
    with open(path, encoding="utf-8") as f:
      return yaml.load(f, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
  except yaml.YAMLError as e:
    raise error(source, "", f"not valid YAML: {e}") from None
  except (OSError, UnicodeDecodeError) as e:
    raise error(source, "", f"cannot be read: {e}") from None


def parse_override(item: str) -> tuple[list[str], Any]:
  if not isinstance(item, str) or "=" not in item:
    raise ConfigError("--set", str(item), "an override must look like key.sub=value")
  key, text = item.split("=", 1)
  keys = key.strip().split(".")
  if not all(k.strip() for k in keys):
    raise ConfigError("--set", key, "empty key in dotted path")
  try:
    value = yaml.safe_load(text) if text.strip() else None
  except yaml.YAMLError as e:
    raise ConfigError("--set", key, f"value is not valid YAML: {e}") from None
  return keys, value


def apply_overrides(raw: Mapping, overrides: Iterable[str]) -> dict:
  """Returns a deep copy of `raw` with dotted `a.b=value` overrides applied."""
  result = _deep_copy(raw)
  for item in overrides or ():
    keys, value = parse_override(item)
    node = result
    for depth, key in enumerate(keys[:-1]):
      child = node.get(key)
      if child is None:
        child = node[key] = {}
      if not isinstance(child, dict):
        raise ConfigError("--set", ".".join(keys[:depth + 1]), "is not a section",
                          value=child)
      node = child
    node[keys[-1]] = value
  return result


def first_difference(a: Any, b: Any, prefix: str = "") -> str:
  """Dotted path of the first field where two config mappings differ."""
  if isinstance(a, Mapping) and isinstance(b, Mapping):
    for key in list(a) + [k for k in b if k not in a]:
      if a.get(key) != b.get(key):
        return first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
  return prefix.rstrip(".") or "<top level>"


def _deep_copy(value):
  if isinstance(value, Mapping):
    return {k: _deep_copy(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_deep_copy(v) for v in value]
  return value


def load_config(config: Union[str, os.PathLike, Mapping, schema.ExperimentConfig],
                overrides: Iterable[str] = ()) -> schema.ExperimentConfig:
  """Loads and validates an experiment config.

  Args:
    config: A YAML path, a plain mapping, or an `ExperimentConfig`.
    overrides: Dotted `key=value` strings (values parsed as YAML).

  Raises:
    ConfigError: naming the file, field, value and what is allowed.
  """
  if isinstance(config, schema.ExperimentConfig):
    config, source = config_to_dict(config), "<config>"
  elif isinstance(config, Mapping):
    source = "<dict>"
  else:
    source, config = str(config), read_yaml(config)
  overrides = list(overrides or ())
  if overrides:
    if not isinstance(config, Mapping):
      raise ConfigError(source, "", "the config must be a mapping of sections", value=config)
    config = apply_overrides(config, overrides)
    source += " (with --set " + " ".join(overrides) + ")"
  return parse_config(config, source)


def config_to_dict(config: schema.ExperimentConfig) -> dict:
  """The YAML-ready mapping of `config` (server hparams flat under `server`)."""
  out = {}
  for f in dataclasses.fields(config):
    value = getattr(config, f.name)
    if dataclasses.is_dataclass(value):
      section = {g.name: plain(getattr(value, g.name)) for g in dataclasses.fields(value)}
      if f.name == "server":
        hparams = section.pop("hparams")
        section = {"optimizer": section.pop("optimizer"), **hparams, **section}
      out[f.name] = section
    else:
      out[f.name] = plain(value)
  return out


def dump_config(config: schema.ExperimentConfig, path: Optional[str] = None) -> str:
  """Returns `config` as YAML; also writes it atomically to `path` when given."""
  text = yaml.safe_dump(config_to_dict(config), sort_keys=False, default_flow_style=False)
  if path is not None:
    atomic_write_text(path, text)
  return text
