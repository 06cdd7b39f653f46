"""The child process that ends a local Ray's processes with the process that
started them, however that one ends.

Ray ties its GCS server and raylet to the driver that started them (their
parent death signal is SIGKILL), and the actors end with their raylet. Its two
agents (dashboard, runtime-env) do not: when their raylet dies without a
SIGTERM in its log, each first tries to report the death to the GCS, which died
with it, and waits for that report's timeout (Ray 2.52,
`ray/_private/process_watcher.py`), outliving a driver killed with SIGKILL.

`ray_session.connect` starts this script right after it starts a local Ray,
with the identities (pid and start time) of the processes `ray.init` started,
and holds the other end of its stdin. The kernel closes that pipe when the
driver ends, however it ends; this process then sends SIGKILL to those of the
processes that still run with the same identity (a reused pid is left alone)
and exits. On a normal end, `ray_session.disconnect` shuts Ray down first and
then closes the pipe: nothing is left to kill but a straggler.

Usage: ray_reaper.py PID:START_TIME ...   (the package's process_table reads /proc)
"""

import contextlib
import os
import signal
import sys


def kill(targets) -> None:
  """SIGKILL to each process of `targets` ((pid, start time) pairs,
  `process_table.identity`) that still runs as itself: a pid reused by another
  process is left alone."""
  from tff_fedadamom.process_table import identity

  for pid, start_time in targets:
    if identity(pid) == (pid, start_time):
      with contextlib.suppress(OSError):  # ended meanwhile
        os.kill(pid, signal.SIGKILL)


def main() -> None:
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  targets = [tuple(int(part) for part in arg.split(":")) for arg in sys.argv[1:]]
  # A Ctrl-C in the driver's terminal reaches this process group too: the driver
  # decides when Ray ends, through the pipe.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  while sys.stdin.buffer.read(1 << 16):
    pass  # nothing is ever written: end of file is the only message
  kill(targets)


if __name__ == "__main__":
  main()
