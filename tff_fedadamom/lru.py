"""Least-recently-used mappings: `collections.OrderedDict`s whose order is their
use, oldest first. `experiment.parts_cache` keeps its parts, data, evaluators and
client tensors in them, `experiment.process` its shared client works."""

from __future__ import annotations

import collections
from typing import Collection


def lru_get(entries: collections.OrderedDict, key: str):
  """`entries[key]`, now the most recently used, or None."""
  if key not in entries:
    return None
  entries.move_to_end(key)
  return entries[key]


def lru_put(entries: collections.OrderedDict, key: str, value, max_size: int,
            keep: Collection[str] = ()) -> None:
  """Sets `entries[key]`, the most recently used, keeping `max_size` entries:
  out goes the least recently used one not in `keep`, else the least recently
  used (`key` itself only when it is the one entry left)."""
  entries[key] = value
  entries.move_to_end(key)
  while len(entries) > max_size:
    out = next((k for k in entries if k not in keep and k != key), next(iter(entries)))
    del entries[out]
