"""Values as plain Python, for YAML and JSON: the one conversion every writer uses."""

from __future__ import annotations

from typing import Any, Mapping


def plain(value: Any) -> Any:
  """`value` with tuples and lists as lists, mappings as dicts and numpy
  scalars (Ray Tune's samples, TensorFlow's `.numpy()` results) as Python
  numbers; anything else as it is."""
  if isinstance(value, (tuple, list)):
    return [plain(v) for v in value]
  if isinstance(value, Mapping):
    return {k: plain(v) for k, v in value.items()}
  item = getattr(value, "item", None)
  if callable(item) and not isinstance(value, str):
    return item()
  return value
