"""`reproduce --verify K`: run K stored units again and compare their results.

The check for what a unit's key does not cover: data pipeline, models, round loop, the
platform's floating point. A unit stored on another machine reproduces within `TOLERANCE`:
float32 kernels round differently on another CPU, and tens of rounds of non-convex training
carry a last-bit difference into the accuracies. Half a point of accuracy (absolute) lies
below the seed-to-seed spread of almost every cell of the report, while a changed pipeline,
model or round loop moves accuracies by more; other floats, of other scales, get 2%
(relative). A round index derived from accuracies may move to a neighbouring evaluation.
"""

from __future__ import annotations

import os
import random
import tempfile
from typing import Callable, Mapping, Sequence

from benchmarks.paper import runs as runs_lib
from benchmarks.paper import units as units_lib

TOLERANCE = {"accuracy (absolute)": 0.005, "other floats (relative)": 0.02}
ROUND_KEYS = ("best_round", "rounds_to_target")


def choose(records: Sequence[dict], k: int, seed: int) -> list:
  ordered = sorted(records, key=lambda r: r["name"])
  return random.Random(seed).sample(ordered, min(k, len(ordered)))


def within_tolerance(stored: Mapping) -> Callable[[str, float, float], bool]:
  """`close(path, stored, now)` for `units.first_difference` under TOLERANCE."""
  evals = (stored.get("eval_rounds") or []) if isinstance(stored, Mapping) else []
  step = max((b - a for a, b in zip(evals, evals[1:])), default=0)
  acc, rel = TOLERANCE.values()

  def close(path: str, a, b) -> bool:
    if "accuracy" in path.rsplit(".", 1)[-1]:
      return abs(a - b) <= acc
    if any(f".{k}" in path for k in ROUND_KEYS):
      return abs(a - b) <= step
    if isinstance(a, int) and isinstance(b, int):
      return a == b
    return abs(a - b) <= rel * max(abs(a), abs(b))

  return close


def _short(value) -> str:
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


def verify(store: units_lib.Store, k: int, seed: int, cache: runs_lib.Cache,
           pool: runs_lib.Pool, log: Callable[[str], None] = print) -> int:
  """0 when all K chosen units reproduce, 1 otherwise (also for a unit whose
  fingerprints no longer match), 2 without units."""
  records = store.records()
  if not records:
    log(f"--verify: no stored units under {store.root}")
    return 2
  chosen = choose(records, k, seed)
  here = units_lib.machine()
  log(f"--verify: {len(chosen)} of {len(records)} stored units (seed {seed}); this "
      f"machine: {here}; tolerance where a unit was stored on another machine: "
      + ", ".join(f"{name} {value:g}" for name, value in TOLERANCE.items())
      + "; round indices within one evaluation interval")
  failures, todo = [], {}
  for record in chosen:
    unit = units_lib.Unit.from_record(record)
    log(f"  {record['name']}: stored at commit {(record.get('source_commit') or 'unknown')[:10]}"
        + (" with uncommitted changes" if record.get("source_dirty") else "")
        + f", on {record.get('machine') or 'an unrecorded machine'}; compared "
        + ("exactly" if record.get("machine") == here else "within the tolerance"))
    if unit.key != units_lib.record_key(record):
      failures.append(f"{record['name']}: {store.why_missing(unit)}; run the study to "
                      "refresh it")
    else:
      todo[unit] = record
  fresh = tempfile.mkdtemp(prefix="verify-", dir=cache.root)
  for unit, future in pool.completed(
      list(todo), run_dir=lambda unit: os.path.join(fresh, f"{unit.name}-{unit.key}")):
    try:
      result, seconds = future.result()
    except Exception as e:  # noqa: BLE001 - a unit that fails does not verify
      failures.append(f"{unit.name}: failed: {type(e).__name__}: {e}")
      continue
    record = todo[unit]
    stored, now = units_lib.comparable(record["result"]), units_lib.comparable(result)
    diff = units_lib.first_difference(stored, now, close=(
        None if record.get("machine") == here else within_tolerance(stored)))
    if diff:
      failures.append(f"{unit.name}: {diff[0]}: stored {_short(diff[1])}, now {_short(diff[2])}")
    else:
      same = units_lib.first_difference(stored, now) is None
      log(f"  {unit.name}: " + ("identical" if same else "within the tolerance")
          + f" ({seconds:.0f}s)")
  for line in failures:
    log(f"  DIFFERS {line}")
  log(f"--verify: {len(chosen) - len(failures)} of {len(chosen)} units reproduce")
  return 1 if failures else 0
