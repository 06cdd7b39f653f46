"""`reproduce --verify K`: run K stored units again and demand identical results.

The units are drawn from the store (sorted by name) with a seeded
`random.Random(seed).sample`, so the same K and seed pick the same units on any
machine. Each runs from scratch (a fresh run directory: no checkpoint of the
original run is reused) in the worker pool; its result, timing fields aside
(`units.TIMING_KEYS`), must equal the stored one exactly. A unit whose key no
longer matches (a method's fingerprint or the unit's version changed since it
was stored) cannot be verified against this code and counts as a failure too.

This is the check for everything the key does not cover: the data pipeline,
the models, the round loop, the platform's floating point.
"""

from __future__ import annotations

import os
import random
import tempfile
from typing import Callable, Sequence

from benchmarks.paper import runs as runs_lib
from benchmarks.paper import units as units_lib


def choose(records: Sequence[dict], k: int, seed: int) -> list:
  """K records (all if fewer), drawn by `seed` from the records sorted by name."""
  ordered = sorted(records, key=lambda r: r["name"])
  return random.Random(seed).sample(ordered, min(k, len(ordered)))


def _short(value) -> str:
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


def stale_reason(unit: units_lib.Unit, record: dict) -> str:
  """Why a stored unit's key differs from the key this code gives it."""
  changed = [m for m in unit.methods
             if unit.fingerprints.get(m) != (record.get("fingerprints") or {}).get(m)]
  if changed:
    return "fingerprint of " + ", ".join(changed) + " changed"
  return "its spec or version changed"


def verify(store: units_lib.Store, k: int, seed: int, cache: runs_lib.Cache,
           pool: runs_lib.Pool, log: Callable[[str], None] = print) -> int:
  """0 when all K chosen units reproduce exactly, 1 otherwise, 2 without units."""
  if k < 1:
    raise ValueError(f"verify: K must be a positive number of units, got {k}")
  records = store.records()
  if not records:
    log(f"--verify: no stored units under {store.root}")
    return 2
  chosen = choose(records, k, seed)
  log(f"--verify: {len(chosen)} of {len(records)} stored units (seed {seed}): "
      + ", ".join(r["name"] for r in chosen))
  failures, todo = [], []
  for record in chosen:
    unit = units_lib.Unit.from_record(record)
    if unit.key != record["key"]:
      failures.append(f"{record['name']}: key: stored {record['key']}, now {unit.key} "
                      f"({stale_reason(unit, record)}); run the study to refresh it")
    else:
      todo.append((unit, record))
  fresh = tempfile.mkdtemp(prefix="verify-", dir=cache.root)
  records_by_name = {u.name: r for u, r in todo}
  for unit, future in runs_lib.completed(
      [u for u, _ in todo], pool,
      run_dir=lambda unit: os.path.join(fresh, f"{unit.name}-{unit.key}")):
    try:
      result, seconds, _ = future.result()
    except Exception as e:  # noqa: BLE001 - a unit that fails does not verify
      failures.append(f"{unit.name}: failed: {type(e).__name__}: {e}")
      continue
    stored = records_by_name[unit.name]["result"]
    diff = units_lib.first_difference(units_lib.comparable(stored),
                                      units_lib.comparable(result))
    if diff:
      path, was, now = diff
      failures.append(f"{unit.name}: {path}: stored {_short(was)}, now {_short(now)}")
    else:
      log(f"  {unit.name}: identical ({seconds:.0f}s)")
  for line in failures:
    log(f"  DIFFERS {line}")
  log(f"--verify: {len(chosen) - len(failures)} of {len(chosen)} units identical")
  return 1 if failures else 0
