"""Reading Linux's process table (`/proc`): which processes run, their parents
and start times; the project's one /proc walk. Nothing here signals or waits
for a process. One that ends while it is read is not reported; off Linux none is.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable, Optional


@dataclasses.dataclass(frozen=True)
class Stat:
  """The fields of `/proc/PID/stat` the project uses: `state` (one letter; 'Z', a
  zombie, has ended), `start_time` (clock ticks after boot: tells a reused pid
  apart), `name` (`comm`, <= 15 characters), and `wait_status`, a zombie's
  status as `waitpid` would report it (None while it runs, or before Linux 3.5).
  """
  pid: int
  state: str
  ppid: int
  start_time: int
  name: str = ""
  wait_status: Optional[int] = None

  @property
  def running(self) -> bool:
    return self.state != "Z"


def stat(pid: int) -> Optional[Stat]:
  """The `Stat` of process `pid`, None if there is none (or it cannot be read)."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      text = f.read().decode(errors="replace")
    # The fields follow the parenthesised command name, which may hold spaces
    # and parentheses: state is field 3, ppid field 4, starttime field 22,
    # exit_code field 52 (meaningful for a zombie only).
    head, tail = text.rsplit(")", 1)
    fields = tail.split()
    status = int(fields[49]) if fields[0] == "Z" and len(fields) > 49 else None
    return Stat(pid=pid, state=fields[0], ppid=int(fields[1]), start_time=int(fields[19]),
                name=head.split("(", 1)[1], wait_status=status)
  except (OSError, IndexError, ValueError):
    return None


def exit_text(returncode: int) -> str:
  """'exited with code N', or 'killed by signal N' for a negative (`Popen`'s) `returncode`."""
  return f"killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"


def how_it_ended(s: Stat) -> str:
  """'runs (S)', 'exited with code 70', 'killed by signal 9' or 'ended': what a
  process' `Stat` says of it, for messages about processes that misbehaved."""
  if s.running:
    return f"runs ({s.state})"
  if s.wait_status is None:
    return "ended"
  signal = s.wait_status & 0x7F
  return exit_text(-signal if signal else s.wait_status >> 8)


def identity(pid: int) -> Optional[tuple[int, int]]:
  """(pid, start time) of a running process, None if it has ended (or is a zombie)."""
  s = stat(pid)
  return (pid, s.start_time) if s is not None and s.running else None


def still_running(pids_: Iterable[int]) -> list[int]:
  """The pids among `pids_` that still run."""
  return [pid for pid in pids_ if identity(pid) is not None]


def pids() -> list[int]:
  """The pids in the process table now (empty without /proc)."""
  try:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
  except OSError:
    return []


def stats() -> list[Stat]:
  """The `Stat` of every process that could be read (zombies included)."""
  return [s for s in map(stat, pids()) if s is not None]


def descendants(roots: int | Iterable[int], table: Optional[Iterable[Stat]] = None) -> list[int]:
  """Every descendant of `roots` (one pid or several), in walk order, without
  the roots. `table` (default: `stats()` now) lets several walks see one moment."""
  roots = [roots] if isinstance(roots, int) else list(roots)
  children: dict[int, list[int]] = {}
  for s in (stats() if table is None else table):
    children.setdefault(s.ppid, []).append(s.pid)
  found, seen, stack = [], set(roots), list(roots)
  while stack:
    for child in children.get(stack.pop(), []):
      if child not in seen:
        seen.add(child)
        found.append(child)
        stack.append(child)
  return found
