"""The tests' and benchmarks' walks of the process table: command lines,
environments, descendants and listening sockets, on top of the library's
`tff_fedadamom.process_table` (whose readers they re-export, so that a test has one
module to ask)."""

from __future__ import annotations

import os
from typing import Iterable, Optional

from tff_fedadamom.process_table import (Stat, descendants, how_it_ended,  # noqa: F401
                                         identity, pids, stat, stats, still_running)


def cmdline(pid: int) -> Optional[bytes]:
  """Process `pid`'s command line, arguments separated by NUL bytes; None if unreadable."""
  return _read(pid, "cmdline")


def environ(pid: int) -> Optional[list[bytes]]:
  """Process `pid`'s environment as `NAME=value` byte strings; None if it cannot be
  read (another user's process, or one that has ended)."""
  raw = _read(pid, "environ")
  return None if raw is None else [item for item in raw.split(b"\0") if item]


def _read(pid: int, name: str) -> Optional[bytes]:
  try:
    with open(f"/proc/{pid}/{name}", "rb") as f:
      return f.read()
  except OSError:
    return None


# TCP's LISTEN state as /proc/net/tcp{,6} spell it.
_TCP_LISTEN = "0A"


def listening(pids_: Iterable[int], tables: Iterable[str] = ("tcp", "tcp6", "udp", "udp6"),
              namespace_of: Optional[int] = None) -> list[tuple[str, str]]:
  """The sockets of processes `pids_` that accept connections: TCP sockets in
  the LISTEN state and bound UDP sockets, as (table, local address) pairs, the
  address in /proc/net's hex form ('0100007F:1F90' is 127.0.0.1:8080).

  Only the sockets of one network namespace are seen: this process's, or with
  `namespace_of`, that process's (/proc/PID/net lists its namespace's sockets).
  """
  inodes = set()
  for pid in pids_:
    try:
      fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
      continue
    for fd in fds:
      try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
      except OSError:
        continue
      if target.startswith("socket:["):
        inodes.add(target[8:-1])
  found = []
  for table in tables:
    try:
      net = "/proc/net" if namespace_of is None else f"/proc/{namespace_of}/net"
      with open(f"{net}/{table}") as f:
        lines = f.readlines()[1:]
    except OSError:
      continue
    for line in lines:
      fields = line.split()
      if fields[9] in inodes and (table.startswith("udp") or fields[3] == _TCP_LISTEN):
        found.append((table, fields[1]))
  return found


# Loopback as /proc/net/tcp{,6} spell it: 127.0.0.1, ::1, ::ffff:127.0.0.1.
LOOPBACK = {"0100007F", "00000000000000000000000001000000",
            "0000000000000000FFFF00000100007F"}


def tcp_listeners(pids_: Iterable[int], namespace_of: Optional[int] = None
                  ) -> list[tuple[str, str]]:
  """The TCP addresses processes `pids_` listen on, as (table, address without
  the port) pairs, in the network namespace `listening` reads."""
  return [(table, address.rsplit(":", 1)[0])
          for table, address in listening(pids_, ("tcp", "tcp6"), namespace_of)]
