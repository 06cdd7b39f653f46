"""The study's units and their stored results, a JSON file each (README.md).

The store indexes a file by the key its spec and fingerprints give under this
code, not by the key it holds: a spec holding a field the config has since
dropped (`RESULT_FREE_RUNTIME`) keeps its unit.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from tff_fedadamom.atomic_io import atomic_write_json

from benchmarks.common import cpuinfo, git

RESULTS_DIR = "results"
# Result fields that measure time, not numerics: stored, never compared.
TIMING_KEYS = frozenset({"total_s", "wall_time_s", "round_seconds", "seconds"})
# Runtime settings that change no result, left out of a unit's spec (with settings
# since removed from the config, `fuse_after_rounds`).
RESULT_FREE_RUNTIME = ("cache", "cache_dir", "fuse_after_rounds", "unroll_max_batches")


def spec_of_config(config: Mapping[str, Any]) -> dict:
  spec = {k: v for k, v in config.items() if k not in ("output_dir", "name")}
  if isinstance(spec.get("runtime"), Mapping):
    spec["runtime"] = {k: v for k, v in spec["runtime"].items()
                       if k not in RESULT_FREE_RUNTIME}
  return spec


# Significant digits of a spec's floats in its hash. A drawn hparam is an exp or a power
# (`tuning.space.sample_trials`), whose last bit depends on the CPU (glibc picks FMA or
# SSE2 code at run time); to 10 digits, CPUs agree.
SPEC_DIGITS = 10


def canonical(spec: Any) -> Any:
  """`spec` with every float rounded to SPEC_DIGITS significant digits."""
  if isinstance(spec, Mapping):
    return {k: canonical(v) for k, v in spec.items()}
  if isinstance(spec, (list, tuple)):
    return [canonical(v) for v in spec]
  if isinstance(spec, float) and math.isfinite(spec):
    return float(f"{spec:.{SPEC_DIGITS}g}")
  return spec


def spec_hash(spec: Any) -> str:
  text = json.dumps(canonical(spec), sort_keys=True, default=str)
  return hashlib.sha1(text.encode()).hexdigest()[:12]


def unit_key(spec: Any, fingerprints: Mapping[str, str]) -> str:
  return spec_hash({"spec": spec, "fingerprints": dict(sorted(fingerprints.items()))})


@functools.lru_cache(maxsize=1)
def machine() -> str:
  """This machine as unit files record it, with its widest vector instructions
  (they decide which kernels TensorFlow runs)."""
  info = cpuinfo()
  flags = set(info.get("flags", "").split())
  isa = next((i for i in ("avx512f", "avx2", "avx", "asimd") if i in flags), "-")
  return (f"{platform.machine()}, {info.get('model name') or platform.processor()}, {isa}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}")


class Unit:
  """One unit of work: an experiment config, or a function with keyword args.

  `methods`: whose fingerprints enter its key (by default an experiment's server
  optimizer); `version`: bumped by hand when a call unit's own code changes its
  numbers (the escape study's rule is not a registry method).
  """

  def __init__(self, name: str, *, config: Optional[dict] = None, fn: Optional[str] = None,
               kwargs: Optional[dict] = None, methods: Sequence[str] = (),
               version: int = 0, fingerprints: Optional[Callable] = None):
    self.name, self.config, self.fn, self.kwargs = name, config, fn, kwargs or {}
    experiment = config is not None
    self.spec = (spec_of_config(config) if experiment
                 else {"fn": fn, "kwargs": self.kwargs, "version": version})
    self.methods = tuple(methods) or ((config["server"]["optimizer"],) if experiment else ())
    self._fingerprints = fingerprints

  @functools.cached_property
  def spec_hash(self) -> str:
    return spec_hash(self.spec)

  @functools.cached_property
  def fingerprints(self) -> dict:
    from benchmarks.paper import fingerprint as fingerprint_lib

    compute = self._fingerprints or fingerprint_lib.fingerprints
    return dict(compute(self.methods)) if self.methods else {}

  @property
  def key(self) -> str:
    return unit_key(self.spec, self.fingerprints)

  @classmethod
  def from_record(cls, record: Mapping[str, Any]) -> "Unit":
    spec, methods = record["spec"], record.get("methods") or ()
    if record["kind"] == "experiment":
      return cls(record["name"], config=dict(spec), methods=methods)
    return cls(record["name"], fn=spec["fn"], kwargs=spec["kwargs"], methods=methods,
               version=spec.get("version", 0))


def record_spec(record: Mapping[str, Any]) -> Any:
  return spec_of_config(record["spec"]) if record["kind"] == "experiment" else record["spec"]


def record_key(record: Mapping[str, Any]) -> str:
  return unit_key(record_spec(record), record.get("fingerprints") or {})


def in_work_tree(path: str) -> bool:
  try:
    return git(path, "rev-parse", "--is-inside-work-tree").stdout.strip() == "true"
  except OSError:  # no git
    return False


def source_commit(path: str, exclude: Optional[str] = None) -> dict:
  """HEAD of the git work tree holding `path`, and whether tracked files outside
  `exclude` differ from it."""
  if not in_work_tree(path):
    return {"commit": None, "dirty": None}
  top = git(path, "rev-parse", "--show-toplevel").stdout.strip()
  head = git(top, "rev-parse", "HEAD").stdout.strip() or None
  spec = ["--", "."] + ([f":(exclude){os.path.relpath(exclude, top)}"] if exclude else [])
  status = git(top, "status", "--porcelain", "--untracked-files=no", *spec).stdout.strip()
  return {"commit": head, "dirty": bool(status)}


class Store:
  """The unit files under `root`. `commit`: git-commit each file `put` writes;
  `source`: this run's `source_commit`, recorded in each."""

  def __init__(self, root: str, *, commit: bool = False, source: Optional[dict] = None):
    self.root = os.path.abspath(root)
    os.makedirs(self.root, exist_ok=True)
    if commit and not in_work_tree(self.root):
      raise ValueError(f"commit_units: {self.root} is not inside a git work tree; "
                       "run without committing or choose an --out inside the repository")
    self.commit = commit
    self.source = dict(source or {"commit": None, "dirty": None})

  def records(self) -> list:
    return sorted(self._index.values(), key=lambda r: r["name"])

  @functools.cached_property
  def _index(self) -> dict:
    """`record_key` -> record of every readable unit file."""
    index = {}
    for folder, _, files in os.walk(self.root):
      for file in sorted(f for f in files if f.endswith(".json") and f[0] != "."):
        try:
          with open(os.path.join(folder, file)) as f:
            record = json.load(f)
        except (OSError, ValueError):
          continue
        if isinstance(record, dict) and {"spec", "kind", "result"} <= set(record):
          index[record_key(record)] = record
    return index

  @functools.cached_property
  def _by_spec(self) -> dict:
    out: dict = {}
    for record in self._index.values():
      out.setdefault(spec_hash(record_spec(record)), []).append(record)
    return out

  def get(self, unit: Unit) -> Optional[Any]:
    """The stored result of a unit with `unit.key` (under any name), or None;
    fingerprints are computed only when a file holds the unit's spec."""
    record = self._index.get(unit.key) if unit.spec_hash in self._by_spec else None
    return None if record is None else record["result"]

  def why_missing(self, unit: Unit) -> str:
    """Why `get(unit)` finds nothing: which fingerprints or spec field differ."""
    for record in self._by_spec.get(unit.spec_hash, []):
      stored = record.get("fingerprints") or {}
      changed = [f"{m} (stored {stored.get(m)}, this code {fp})"
                 for m, fp in unit.fingerprints.items() if stored.get(m) != fp]
      return "fingerprints differ: " + (", ".join(changed) or "other methods")
    named = next((r for r in self._index.values() if r["name"] == unit.name), None)
    if named is None:
      return "no unit file"
    where = first_difference(canonical(record_spec(named)), canonical(unit.spec), "spec")
    return f"its file holds another spec ({where[0]}: {where[1]!r}, now {where[2]!r})"

  def put(self, unit: Unit, result: Any, wall_time_s: float) -> str:
    record = {"name": unit.name, "key": unit.key,
              "kind": "call" if unit.config is None else "experiment", "spec": unit.spec,
              "methods": list(unit.methods), "fingerprints": unit.fingerprints,
              "result": result, "wall_time_s": round(float(wall_time_s), 3),
              "source_commit": self.source.get("commit"),
              "source_dirty": self.source.get("dirty"), "machine": machine(),
              "written": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    path = os.path.join(self.root, unit.name + ".json")
    atomic_write_json(path, record)
    for key in [k for k, r in self._index.items() if r["name"] == unit.name]:
      del self._index[key]  # the file now holds the new key
    self._index[unit.key] = json.loads(json.dumps(record))
    self.__dict__.pop("_by_spec", None)
    if self.commit:  # `git add` and `git commit` of exactly this file, nothing else staged
      message = f"Paper study: unit {unit.name} ({unit.key})"
      for args in (["add", "--", path], ["commit", "-q", "-m", message, "--", path]):
        done = git(os.path.dirname(path), *args)
        if done.returncode != 0:
          raise RuntimeError(f"git {args[0]} of {path} failed: "
                             f"{(done.stderr or done.stdout).strip()}")
    return path


def comparable(result: Any) -> Any:
  """`result` as JSON stores it, without TIMING_KEYS at any depth."""
  return json.loads(json.dumps(result), object_hook=lambda record: {
      k: v for k, v in record.items() if k not in TIMING_KEYS})


def first_difference(stored: Any, now: Any, path: str = "result",
                     close: Optional[Callable[[str, float, float], bool]] = None
                     ) -> Optional[tuple]:
  """(path, stored value, new value) of the first field where two results differ,
  or None. Numbers compare exactly, or by `close(path, stored, now)`; NaN equals
  NaN; a missing field is None."""
  if isinstance(stored, dict) and isinstance(now, dict):
    found = ((f"{path}.{k}", stored.get(k), now.get(k)) if k not in stored or k not in now
             else first_difference(stored[k], now[k], f"{path}.{k}", close)
             for k in sorted(set(stored) | set(now), key=str))
    return next((d for d in found if d), None)
  if isinstance(stored, list) and isinstance(now, list):
    if len(stored) != len(now):
      return f"{path} (length)", len(stored), len(now)
    found = (first_difference(a, b, f"{path}[{i}]", close)
             for i, (a, b) in enumerate(zip(stored, now)))
    return next((d for d in found if d), None)
  if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (stored, now)):
    if math.isnan(stored) and math.isnan(now):
      return None
    same = close(path, stored, now) if close is not None else (
        stored == now and type(stored) is type(now))
    return None if same else (path, stored, now)
  return None if type(stored) is type(now) and stored == now else (path, stored, now)
