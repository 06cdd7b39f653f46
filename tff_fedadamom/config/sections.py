"""Typed config sections: the one place a raw mapping becomes a frozen dataclass.
Every problem raises the caller's error type (`ConfigError` or a subclass).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Iterable, Mapping, Union

from tff_fedadamom.config.errors import ConfigError
from tff_fedadamom.naming import suggest


def _type_name(tp) -> str:
  names = {int: "an integer", float: "a number", str: "a string", bool: "true/false",
           dict: "a mapping", tuple: "a list"}
  return names.get(tp, getattr(tp, "__name__", str(tp)))


def reject_numeric_string(value: Any, source: str, path: str,
                          error: type = ConfigError) -> None:
  """Raises `error` explaining YAML 1.1's exponent rule if `value` is a number
  that YAML read as a string, such as '1e-3' or '1.0e38'."""
  if not isinstance(value, str):
    return
  try:
    float(value)
  except ValueError:
    return
  raise error(source, path, "YAML read this as a string, not a number", value=value,
              allowed="a number with a dot and a signed exponent, e.g. 1.0e-3 or 1.0e+38")


def coerce(value, tp, source: str, path: str, error: type = ConfigError, *,
           string_numbers: bool = False):
  """Checks `value` against the annotation `tp`; returns it in canonical form.

  With `string_numbers`, a number YAML read as a string ('1e-3') gets its own message.
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
      raise error(source, f"{prefix}{key}",
                  "unknown key" + suggest(key, valid, by_prefix=by_prefix),
                  allowed=", ".join(valid))


def _section_type(tp):
  """The dataclass of a nested section's annotation (`X` or `Optional[X]`), else None."""
  args = [a for a in typing.get_args(tp) if a is not type(None)]
  inner = args[0] if typing.get_origin(tp) is Union and len(args) == 1 else tp
  return inner if dataclasses.is_dataclass(inner) else None


def build_section(cls, raw: Any, source: str, prefix: str, *, extra_ok: bool = False,
                  error: type = ConfigError, by_prefix: bool = False,
                  string_numbers: bool = False):
  """Builds dataclass `cls` from mapping `raw`; returns (instance, leftover keys).

  Each field is checked against its annotation and the checks in its metadata
  (`schema.checked_field`); a field whose type is a dataclass is a nested section,
  built the same way. `by_prefix` widens the 'did you mean' hints of unknown keys
  (see `suggest`), `string_numbers` is `coerce`'s.
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
      if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
        why = meta.get("why")
        raise error(source, path, "missing" + (f" ({why})" if why else ""),
                    allowed=meta.get("allowed"))
      continue
    section = _section_type(hints[name])
    if section is not None:
      kwargs[name] = None if raw[name] is None and section is not hints[name] else (
          build_section(section, raw[name], source, path + ".", error=error,
                        by_prefix=by_prefix, string_numbers=string_numbers)[0])
      continue
    value = coerce(raw[name], hints[name], source, path, error,
                   string_numbers=string_numbers)
    choices = meta.get("choices")
    if value is not None and choices is not None and value not in choices:
      raise error(source, path, "unknown value" + suggest(value, choices, by_prefix=by_prefix),
                  value=value, allowed=meta.get("allowed") or ", ".join(choices))
    check = meta.get("check")
    if value is not None and check is not None and not check(value):
      raise error(source, path, meta.get("problem") or "out of range", value=value,
                  allowed=meta.get("allowed"))
    kwargs[name] = value
  leftover = {k: v for k, v in raw.items() if k not in names}
  return cls(**kwargs), leftover
