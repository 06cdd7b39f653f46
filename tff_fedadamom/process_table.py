"""Reading Linux's process table (`/proc`): which processes run, their parents
and start times.

The one home of the project's /proc walk: the runtime finds which workers TFF
started still run, and a sweep worker checks that its trial's owner still runs
(the tests' walks, over command lines, environments, descendants and sockets,
build on these in `tests/process_table.py`). Nothing here signals, waits for or
otherwise changes a process; callers decide what to do with pids.

A process that ends while it is being read is simply not reported; off Linux
(no /proc) none is.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional


@dataclasses.dataclass(frozen=True)
class Stat:
  """The fields of `/proc/PID/stat` the project uses.

  Attributes:
    pid: The process id.
    state: One letter, e.g. 'R', 'S', 'Z' (zombie: ended, not yet reaped).
    ppid: The parent's pid.
    start_time: When the process started, in clock ticks after boot; tells a
      reused pid apart.
  """
  pid: int
  state: str
  ppid: int
  start_time: int

  @property
  def running(self) -> bool:
    """False for a zombie, which has ended and only waits to be reaped."""
    return self.state != "Z"


def stat(pid: int) -> Optional[Stat]:
  """The `Stat` of process `pid`, None if there is none (or it cannot be read)."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      text = f.read().decode(errors="replace")
    # The fields follow the parenthesised command name, which may hold spaces
    # and parentheses: state is field 3, ppid field 4, starttime field 22.
    fields = text.rsplit(")", 1)[1].split()
    return Stat(pid=pid, state=fields[0], ppid=int(fields[1]), start_time=int(fields[19]))
  except (OSError, IndexError, ValueError):
    return None


def still_running(pids_: Iterable[int]) -> list[int]:
  """The pids among `pids_` that still run (a zombie counts as ended)."""
  alive = []
  for pid in pids_:
    s = stat(pid)
    if s is not None and s.running:
      alive.append(pid)
  return alive


def identity(pid: int) -> Optional[tuple[int, int]]:
  """(pid, start time in clock ticks) of a running process, None if it has ended;
  the start time tells a reused pid apart."""
  s = stat(pid)
  return (pid, s.start_time) if s is not None and s.running else None
