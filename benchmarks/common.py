"""What every benchmark script shares: timing, ratios, provenance, RESULTS.md.

`benchmarks/RESULTS.md` is generated: each script rewrites its own block of it,
between `<!-- begin: NAME -->` and `<!-- end: NAME -->`, with the provenance and
figures of one run. Ratios of calls timed in pairs (`interleaved`) are the
median of the per-pair ratios: on a shared machine a burst of load slows both
sides of a pair alike and cancels out. A figure a run did not measure is
written `NOT_MEASURED`, never estimated.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import re
import statistics
import subprocess
import time
from typing import Callable, Mapping, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "RESULTS.md")
NOT_MEASURED = "not measured"
HEADER = """# Benchmark results

Generated: `make bench` writes every section; each script rewrites its own section when it
runs (`.venv/bin/python -m benchmarks.<script> --help` lists its options). Each section names
the commit, machine and date of the one run its figures come from; ratios compare figures of
that same run. Figures depend on the machine and on what else runs on it.

| script | measures |
|---|---|
| `benchmarks/optimizer_step.py` | each server optimizer's step against the least memory traffic its state needs |
| `benchmarks/rounds.py` | a round on each backend (inprocess, ray, tff_cpp) against the same arithmetic in one `tf.function`; memory over a long run |
| `benchmarks/sweeps.py` | the quickstart sweep, cold and warm, against its trials as separate runs; a shortened fmnist sweep, cold and warm |
"""


def interleaved(calls: Mapping[str, Callable[[], object]], repeats: int,
                warmups: int = 1) -> dict[str, list[float]]:
  """Seconds of each call, `repeats` times, after `warmups` untimed calls each
  (tracing, compiling); round-robin, the first call rotating each repeat: the
  i-th times of two calls are a pair, for `paired_ratio`."""
  for call in calls.values():
    for _ in range(warmups):
      call()
  names, times = list(calls), {name: [] for name in calls}
  for i in range(repeats):
    for name in names[i % len(names):] + names[:i % len(names)]:
      start = time.perf_counter()
      calls[name]()
      times[name].append(time.perf_counter() - start)
  return times


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  """a / b, or None when either was not measured or b is not positive."""
  return None if a is None or b is None or b <= 0 else a / b


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
  """The median of a[i] / b[i] over the pairs (None without any pair)."""
  pairs = [x / y for x, y in zip(a, b, strict=True) if y > 0]
  return statistics.median(pairs) if pairs else None


def fmt(value: Optional[float], spec: str = ".2f") -> str:
  """`value` formatted with `spec`, or NOT_MEASURED for None."""
  return NOT_MEASURED if value is None else f"{value:{spec}}"


def goal(value: Optional[float], target: float, at_least: bool = True) -> str:
  """"met" / "NOT met" of `value` against `target` (>= it, else <= it)."""
  if value is None:
    return NOT_MEASURED
  return "met" if (value >= target if at_least else value <= target) else "NOT met"


def cpuinfo() -> dict:
  """The first processor's fields in /proc/cpuinfo (Linux; elsewhere {})."""
  try:
    with open("/proc/cpuinfo") as f:
      block = f.read().split("\n\n")[0]
  except OSError:
    return {}
  return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in block.splitlines()
                                            if ":" in line)}


def git(repo: str, *args: str) -> subprocess.CompletedProcess:
  """`git -C repo args`, its output as text (git's exit status is not checked)."""
  return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)


def commit(repo: str = ROOT) -> str:
  """The checkout's short commit, with "+ uncommitted changes" if it has any."""
  head = git(repo, "rev-parse", "--short", "HEAD").stdout.strip() or "unknown commit"
  dirty = git(repo, "status", "--porcelain").stdout.strip()
  return head + (" + uncommitted changes" if dirty else "")


def provenance(repo: str = ROOT) -> str:
  """One line: the commit, the machine (CPU model, cores, load) and the date (UTC)."""
  now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  cpu = cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown CPU"
  return (f"commit {commit(repo)}; {cpu}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f} at the end; {now}")


def replace_section(text: str, name: str, body: str) -> str:
  """`text` with section `name`'s block holding `body`; the block is appended
  if `text` has none. Everything outside the block is kept byte for byte."""
  if not re.fullmatch(r"[a-z0-9_]+", name):
    raise ValueError(f"section name {name!r}: allowed are lowercase letters, digits and '_'")
  begin, end = f"<!-- begin: {name} -->", f"<!-- end: {name} -->"
  block = f"{begin}\n{body.strip()}\n{end}"
  starts, ends = text.count(begin), text.count(end)
  if (starts, ends) == (0, 0):
    return (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
  if (starts, ends) != (1, 1) or text.index(begin) > text.index(end):
    raise ValueError(f"RESULTS.md: section {name!r} must have one {begin} before one {end}")
  head, rest = text.split(begin, 1)
  return head + block + rest.split(end, 1)[1]


def write_section(name: str, title: str, body: str, path: str = RESULTS,
                  repo: str = ROOT) -> str:
  """Rewrites section `name` of the results file at `path` (made with HEADER if
  missing) as `## title`, the provenance line of `repo` and `body`; returns it."""
  from tff_fedadamom.atomic_io import atomic_write_text

  text = f"## {title}\n\n{provenance(repo)}\n\n{body.strip()}\n"
  old = pathlib.Path(path).read_text() if os.path.exists(path) else HEADER
  atomic_write_text(path, replace_section(old, name, text))
  return text
