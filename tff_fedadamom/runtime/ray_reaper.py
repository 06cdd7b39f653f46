"""The child process that ends a local Ray's processes with the process that
started them, however that one ends.

Ray ties its GCS server and raylet to the driver that started them, and the
actors end with their raylet. Its two agents (dashboard, runtime-env) do not:
when their raylet dies without a SIGTERM in its log, each first tries to report
the death to the GCS, which died with it, and waits for that report's timeout
(Ray 2.52, `ray/_private/process_watcher.py`), outliving a killed driver.

`ray_session.connect` starts this script right after a local Ray, with the
identities (pid and start time) of the processes `ray.init` started, and holds
the other end of its stdin. The kernel closes that pipe when the driver ends,
however it ends; this process then SIGKILLs those processes still running as
themselves and exits. `ray_session.disconnect` shuts Ray down first.

Usage: ray_reaper.py PID:START_TIME ...   (the package's process_table reads /proc)
"""

import contextlib
import os
import signal
import sys


def kill(targets) -> None:
  """SIGKILL to each process of `targets` (`process_table.identity` pairs) that
  still runs as itself: a reused pid is left alone."""
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
