"""YAML -> validated `ExperimentConfig`, dotted overrides, and the way back to YAML.

Types and ranges are checked against the schema, names and their options
against the registries; the first problem raises a `ConfigError`. YAML is
safe-loaded, so Python object tags are refused.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Mapping, Optional, Union

import yaml

from tff_fedadamom.atomic_io import atomic_write_text
from tff_fedadamom.config import schema
from tff_fedadamom.config.errors import ConfigError
from tff_fedadamom.config.sections import build_section
from tff_fedadamom.config.validate import check_registries
from tff_fedadamom.plain import plain

# Set (on the instance, outside the dataclass fields) on what `parse_config`
# returns. `dataclasses.replace` builds a new instance without it, so a config
# changed after validation is validated again; pickling and copying keep it.
_VALIDATED = "_validated"


def parse_config(raw: Any, source: str = "<dict>") -> schema.ExperimentConfig:
  """Builds and fully validates an `ExperimentConfig` from a plain mapping."""
  if not isinstance(raw, Mapping):
    raise ConfigError(source, "", "the config must be a mapping of sections", value=raw)
  raw = dict(raw)
  server_raw = raw.pop("server", None)
  config, _ = build_section(schema.ExperimentConfig, raw, source, "")
  server, hparams = build_section(schema.ServerConfig, server_raw, source, "server.",
                                  extra_ok=True)
  if "hparams" in (server_raw or {}):
    raise ConfigError(source, "server.hparams", "write the optimizer's hparams directly "
                      "under 'server' (e.g. server.learning_rate)")
  config = dataclasses.replace(config, server=dataclasses.replace(server, hparams=hparams))
  for i, target in enumerate(config.targets):
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not (
        0 < target <= 1):
      raise ConfigError(source, f"targets[{i}]", "out of range", value=target,
                        allowed="accuracies in (0, 1]")
  config = check_registries(config, source)
  object.__setattr__(config, _VALIDATED, True)  # frozen: the one write, see _VALIDATED
  return config


def is_validated(config: Any) -> bool:
  """True for an `ExperimentConfig` that `parse_config` returned (and nothing
  has replaced since): `load_config` returns it as it is."""
  return isinstance(config, schema.ExperimentConfig) and vars(config).get(_VALIDATED, False)


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
  """The validated config of a YAML path, a mapping or an `ExperimentConfig`,
  with dotted `key=value` `overrides` (values parsed as YAML). A config this
  returned before comes back as it is unless `overrides` change it.
  """
  overrides = list(overrides or ())
  if is_validated(config) and not overrides:
    return config
  if isinstance(config, schema.ExperimentConfig):
    config, source = config_to_dict(config), "<config>"
  elif isinstance(config, Mapping):
    source = "<dict>"
  else:
    source, config = str(config), read_yaml(config)
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
    elif value is not None or f.name not in schema.SECTIONS:  # an absent optional section
      out[f.name] = plain(value)
  return out


def dump_config(config: schema.ExperimentConfig, path: Optional[str] = None) -> str:
  """Returns `config` as YAML; also writes it atomically to `path` when given."""
  text = yaml.safe_dump(config_to_dict(config), sort_keys=False, default_flow_style=False)
  if path is not None:
    atomic_write_text(path, text)
  return text
