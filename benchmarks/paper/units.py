"""The study's units and their committed results: one JSON file per completed unit.

A unit is one tuning trial, one final run (an experiment config each) or the
escape simulation (a function call). Its *key* is a hash of what it runs (the
experiment config without its output directory and name, or the function and
its arguments) together with the numerics fingerprint of every method it runs
(`fingerprint.py`). The key leaves out the source files on purpose: moving or
reformatting code keeps every committed unit, while a change of a method's
numerics changes its fingerprint and so runs that method's units again. Changes
elsewhere (data, models, the round loop) are not in the key; `reproduce
--verify` re-runs committed units to catch those.

When a unit completes, `Store.put` writes `<out>/results/<name>.json`
atomically: its name, key, spec, fingerprints, result, wall time and the git
commit its code came from; with `commit=True` it also commits that one file
(`git add` + `git commit -- <file>`, inside a git work tree only, never pushing).
A later run, on any machine with the files, loads every unit whose key matches a
file and runs only the others, so a study continues wherever it stopped.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from tff_fedadamom.atomic_io import atomic_write_json

RESULTS_DIR = "results"
# Result fields that measure time, not numerics: stored, but never compared by
# --verify (they differ on every run).
TIMING_KEYS = frozenset({"total_s", "wall_time_s", "round_seconds", "seconds"})


# Runtime settings that change no result: whether and where compiled processes
# are cached, and when rounds become one TensorFlow call (keys of units stored
# before these settings existed stay the same).
RESULT_FREE_RUNTIME = ("cache", "cache_dir", "fuse_after_rounds", "unroll_max_batches")


def spec_of_config(config: Mapping[str, Any]) -> dict:
  """The part of an experiment config a unit's key covers (not where it writes,
  nor `RESULT_FREE_RUNTIME`)."""
  spec = {k: v for k, v in config.items() if k not in ("output_dir", "name")}
  if isinstance(spec.get("runtime"), Mapping):
    spec["runtime"] = {k: v for k, v in spec["runtime"].items()
                       if k not in RESULT_FREE_RUNTIME}
  return spec


def spec_hash(spec: Any) -> str:
  """A short stable hash of a JSON-able value."""
  text = json.dumps(spec, sort_keys=True, default=str)
  return hashlib.sha1(text.encode()).hexdigest()[:12]


def unit_key(spec: Any, fingerprints: Mapping[str, str]) -> str:
  """The key of a unit: its spec and the fingerprints of the methods it runs."""
  return spec_hash({"spec": spec, "fingerprints": dict(sorted(fingerprints.items()))})


class Unit:
  """One unit of work: an experiment config, or a function with keyword args.

  `name` is where the unit lives (`<study>/.../<label>`); `methods` are the
  registry methods whose fingerprints enter its key (an experiment: its server
  optimizer); `version` is bumped by hand when a call unit's own simulation code
  changes its numbers (the escape study's rule is not a registry method).
  """

  def __init__(self, name: str, *, config: Optional[dict] = None, fn: Optional[str] = None,
               kwargs: Optional[dict] = None, methods: Sequence[str] = (),
               version: int = 0, fingerprints: Optional[Callable] = None):
    self.name = name
    self.config = config
    self.fn = fn
    self.kwargs = kwargs or {}
    if config is not None:
      self.spec = spec_of_config(config)
      self.methods = tuple(methods) or (config["server"]["optimizer"],)
    else:
      self.spec = {"fn": fn, "kwargs": self.kwargs, "version": version}
      self.methods = tuple(methods)
    self._fingerprints = fingerprints
    self._computed: Optional[dict] = None

  @property
  def kind(self) -> str:
    return "experiment" if self.config is not None else "call"

  @functools.cached_property
  def spec_hash(self) -> str:
    return spec_hash(self.spec)

  @property
  def fingerprints(self) -> dict:
    """{method: fingerprint}, computed in this process on first use, unless a
    worker that ran the unit computed them already (`adopt_fingerprints`)."""
    if self._computed is None:
      from benchmarks.paper import fingerprint as fingerprint_lib

      compute = self._fingerprints or fingerprint_lib.fingerprints
      self._computed = dict(compute(self.methods)) if self.methods else {}
    return self._computed

  def adopt_fingerprints(self, fingerprints: Mapping[str, str]) -> None:
    """Takes the fingerprints the worker that ran this unit computed (the same
    code, so the same values: a difference is an error)."""
    given = dict(fingerprints)
    if set(given) != set(self.methods):
      raise ValueError(f"unit {self.name}: fingerprints of {sorted(given)}, expected "
                       f"{sorted(self.methods)}")
    if self._computed is not None and self._computed != given:
      raise RuntimeError(f"unit {self.name}: the worker's fingerprints {given} differ from "
                         f"this process's {self._computed}: the numerics are not "
                         "deterministic on this machine")
    self._computed = given

  @property
  def key(self) -> str:
    return unit_key(self.spec, self.fingerprints)

  @classmethod
  def from_record(cls, record: Mapping[str, Any]) -> "Unit":
    """The unit a committed file describes (to run it again)."""
    spec = record["spec"]
    if record["kind"] == "experiment":
      return cls(record["name"], config=dict(spec), methods=record.get("methods") or ())
    return cls(record["name"], fn=spec["fn"], kwargs=spec["kwargs"],
               methods=record.get("methods") or (), version=spec.get("version", 0))


# ---------------------------------------------------------------------------- git


def _git(args: Sequence[str], cwd: str) -> subprocess.CompletedProcess:
  return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                        check=False)


def in_work_tree(path: str) -> bool:
  try:
    return _git(["rev-parse", "--is-inside-work-tree"], path).stdout.strip() == "true"
  except OSError:  # no git
    return False


def source_commit(path: str, exclude: Optional[str] = None) -> dict:
  """HEAD of the git work tree holding `path`, and whether its tracked files
  differ from HEAD (the directory `exclude` aside: the unit files themselves):
  the code a unit computed with. Resolved once per run."""
  if not in_work_tree(path):
    return {"commit": None, "dirty": None}
  top = _git(["rev-parse", "--show-toplevel"], path).stdout.strip()
  head = _git(["rev-parse", "HEAD"], top).stdout.strip() or None
  spec = ["--", "."] + ([f":(exclude){os.path.relpath(exclude, top)}"] if exclude else [])
  status = _git(["status", "--porcelain", "--untracked-files=no", *spec], top).stdout.strip()
  return {"commit": head, "dirty": bool(status)}


def commit_file(path: str, message: str) -> None:
  """`git add` and `git commit` of exactly `path` (nothing else that is staged)."""
  cwd = os.path.dirname(path)
  for args in (["add", "--", path], ["commit", "-q", "-m", message, "--", path]):
    done = _git(args, cwd)
    if done.returncode != 0:
      raise RuntimeError(f"git {args[0]} of {path} failed: "
                         f"{(done.stderr or done.stdout).strip()}")


# ---------------------------------------------------------------------------- the store


class Store:
  """The unit files under `root`, indexed by key (read once, kept up to date).

  Args:
    root: The results directory (`<out>/results`).
    commit: Commit each file `put` writes (`--commit-units`); ValueError when
      `root` is not inside a git work tree.
    source: `source_commit(...)` of this run, recorded in every file.
  """

  def __init__(self, root: str, *, commit: bool = False, source: Optional[dict] = None):
    self.root = os.path.abspath(root)
    os.makedirs(self.root, exist_ok=True)
    if commit and not in_work_tree(self.root):
      raise ValueError(f"commit_units: {self.root} is not inside a git work tree; "
                       "run without committing or choose an --out inside the repository")
    self.commit = commit
    self.source = dict(source or {"commit": None, "dirty": None})
    self._index: Optional[dict] = None
    self._specs: Optional[set] = None

  def path(self, name: str) -> str:
    return os.path.join(self.root, name + ".json")

  def records(self) -> list:
    """Every readable unit file, by name."""
    return sorted(self._load().values(), key=lambda r: r["name"])

  def _load(self) -> dict:
    if self._index is None:
      self._index = {}
      for folder, _, files in os.walk(self.root):
        for file in sorted(files):
          if not file.endswith(".json") or file.startswith("."):
            continue
          try:
            with open(os.path.join(folder, file)) as f:
              record = json.load(f)
          except (OSError, ValueError):
            continue
          if isinstance(record, dict) and "key" in record and "result" in record:
            self._index[record["key"]] = record
    return self._index

  def _spec_hashes(self) -> set:
    if self._specs is None:
      self._specs = {spec_hash(r["spec"]) for r in self._load().values()}
    return self._specs

  def get(self, unit: Unit) -> Optional[Any]:
    """The stored result of a unit with `unit.key` (under any name), or None.
    Fingerprints are computed only when a file holds the unit's spec: a unit
    never run before needs none here (its worker computes them)."""
    if unit.spec_hash not in self._spec_hashes():
      return None
    record = self._load().get(unit.key)
    return None if record is None else record["result"]

  def put(self, unit: Unit, result: Any, wall_time_s: float) -> str:
    """Writes (and with `commit`, commits) the unit's file; returns its path."""
    record = {
        "name": unit.name, "key": unit.key, "kind": unit.kind, "spec": unit.spec,
        "methods": list(unit.methods), "fingerprints": unit.fingerprints,
        "result": result, "wall_time_s": round(float(wall_time_s), 3),
        "source_commit": self.source.get("commit"),
        "source_dirty": self.source.get("dirty"),
        "written": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    path = self.path(unit.name)
    atomic_write_json(path, record)
    index = self._load()
    for key in [k for k, r in index.items() if r["name"] == unit.name]:
      del index[key]  # the file now holds the new key
    index[unit.key] = json.loads(json.dumps(record))
    self._spec_hashes().add(unit.spec_hash)
    if self.commit:
      commit_file(path, f"Paper study: unit {unit.name} ({unit.key})")
    return path


# ---------------------------------------------------------------------------- comparing


def comparable(result: Any) -> Any:
  """`result` as JSON stores it, without its timing fields (TIMING_KEYS)."""
  def strip(value):
    if isinstance(value, Mapping):
      return {k: strip(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
      return [strip(v) for v in value]
    return value

  return strip(json.loads(json.dumps(result)))


def first_difference(stored: Any, now: Any, path: str = "result") -> Optional[tuple]:
  """(path, stored value, new value) of the first field where two results
  differ (NaN equals NaN; a missing field is None), or None when identical."""
  if isinstance(stored, dict) and isinstance(now, dict):
    for k in sorted(set(stored) | set(now), key=str):
      if k not in stored or k not in now:
        return f"{path}.{k}", stored.get(k), now.get(k)
      found = first_difference(stored[k], now[k], f"{path}.{k}")
      if found:
        return found
    return None
  if isinstance(stored, list) and isinstance(now, list):
    if len(stored) != len(now):
      return f"{path} (length)", len(stored), len(now)
    for i, (a, b) in enumerate(zip(stored, now)):
      found = first_difference(a, b, f"{path}[{i}]")
      if found:
        return found
    return None
  if isinstance(stored, float) and isinstance(now, float) and stored != stored and now != now:
    return None
  if type(stored) is not type(now) or stored != now:
    return path, stored, now
  return None
