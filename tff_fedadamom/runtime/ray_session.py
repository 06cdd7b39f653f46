"""Connecting to Ray: a local instance on loopback, or an existing cluster.

Ray is imported only when a session starts, so `import tff_fedadamom` never
pulls it in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
import warnings
from typing import Any, Optional

from tff_fedadamom import process_table
from tff_fedadamom.runtime import ray_reaper

LOG = logging.getLogger(__name__)

REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_reaper.py")
# The reaper of the local Ray this process started (`ray_reaper`), while it runs.
# Ray's own state is per process too: one local instance at a time.
_reaper: Optional[subprocess.Popen] = None


def _init_kwargs(address: Optional[str], resources: Optional[dict]) -> dict[str, Any]:
  """`ray.init`'s arguments for `connect(address, resources)`."""
  # configure_logging=False: Ray leaves this process' loggers alone (its
  # warnings still reach stderr through Python's last-resort handler).
  kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                configure_logging=False)
  if address is None:
    # "local": a new instance even if RAY_ADDRESS is set or a `ray start`
    # cluster runs on this machine. Its processes inherit this one's
    # environment, so the job needs no runtime environment (with one, Ray
    # starts every worker anew instead of using those it started).
    kwargs.update(address="local", _node_ip_address="127.0.0.1", **(resources or {}))
  else:
    # A cluster's workers have the cluster's environment: the job sets the log level.
    env = {"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    kwargs.update(address=address, runtime_env={"env_vars": env})
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    if host in ("127.0.0.1", "localhost"):
      kwargs["_node_ip_address"] = "127.0.0.1"
    kwargs.pop("include_dashboard")  # the cluster's own setting applies
  return kwargs


# A local start is tried up to three times: now and then the GCS server of a new
# local Ray ends before writing its log, and `ray.init` fails with
# FileNotFoundError on the missing log, cause unknown. The warning says how each
# process a failed try left had ended, so that an occurrence names it; what the
# try left running is ended, and each try waits longer than the one before.
_LOCAL_TRIES = 3
_PAUSE_BEFORE_TRY_S = (0.0, 2.0, 10.0)


def _init(ray, kwargs: dict, tries: int, left_by) -> None:
  """`ray.init(**kwargs)`, tried `tries` times; `left_by()` lists the pids the
  tries may have left (each failed try's are described, then killed)."""
  told: set[int] = set()
  for attempt in range(tries):
    time.sleep(_PAUSE_BEFORE_TRY_S[attempt])
    try:
      with warnings.catch_warnings():
        # Ray's notice that zero-GPU tasks will see the GPUs one day: tasks
        # without a GPU hide them themselves.
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray",
                                category=FutureWarning)
        ray.init(**kwargs)
      return
    except Exception as error:  # noqa: BLE001 - Ray raises many kinds at start
      if attempt == tries - 1:
        raise
      # Read before `ray.shutdown`: Ray's handles on its processes, and the
      # zombies of those it has not waited for.
      left = [s for s in map(process_table.stat, sorted(set(left_by()) - told)) if s is not None]
      said = {s.pid: f"{s.name} {s.pid} ({process_table.how_it_ended(s)})" for s in left}
      said.update(_started_by_ray(error))
      told.update(said)
      LOG.warning("a local Ray failed to start (%s: %s); it had left %s; starting it again "
                  "in %g s", type(error).__name__, error,
                  ", ".join(said[pid] for pid in sorted(said)) or "no process",
                  _PAUSE_BEFORE_TRY_S[attempt + 1])
      ray.shutdown()
      ray_reaper.kill([(s.pid, s.start_time) for s in left if s.running])


def _started_by_ray(error: BaseException) -> dict[int, str]:
  """pid -> 'gcs_server 123 (exited with code 1)' for each process a failed
  `ray.init` had started, from Ray's `Node.all_processes` among the error's
  frames: Ray has reaped a GCS server it found ended, so only its handle has
  the exit status."""
  found: dict[int, str] = {}
  frame = error.__traceback__
  while frame is not None:
    processes = getattr(frame.tb_frame.f_locals.get("self"), "all_processes", None)
    for kind, infos in (processes if isinstance(processes, dict) else {}).items():
      for handle in (getattr(info, "process", None) for info in infos):
        if isinstance(handle, subprocess.Popen):
          code = handle.poll()
          found[handle.pid] = (f"{kind} {handle.pid} ("
                               f"{'runs' if code is None else process_table.exit_text(code)})")
    frame = frame.tb_next
  return found


def connect(address: Optional[str], resources: Optional[dict] = None) -> bool:
  """Connects this process to Ray as `address` says; True if it started a session.

  `None` starts a new local Ray bound to 127.0.0.1 with the dashboard off, and a
  reaper (`ray_reaper`) that ends its processes if this one ends without
  `disconnect`; `auto` or host:port joins a cluster. An already initialised Ray
  is used as it is (False: the caller must not shut it down). `resources` (a
  new local instance only), e.g. `{"num_cpus": 1}`, replace what Ray detects.
  """
  global _reaper
  import ray

  if resources and address is not None:
    raise ValueError(f"resources={resources!r} apply to a new local Ray only, "
                     f"not to address={address!r}")
  if ray.is_initialized():
    return False
  kwargs = _init_kwargs(address, resources)
  # The processes ray.init starts are this process' new descendants.
  before = set(process_table.descendants(os.getpid())) if address is None else None

  def new_pids() -> list[int]:  # ended ones included
    return [pid for pid in process_table.descendants(os.getpid()) if pid not in before]

  _init(ray, kwargs, tries=_LOCAL_TRIES if address is None else 1,
        left_by=new_pids if address is None else list)
  if before is not None:
    # -I: the reaper needs the standard library and process_table only.
    _reaper = subprocess.Popen(
        [sys.executable, "-I", REAPER,
         *(f"{pid}:{t}" for pid, t in filter(None, map(process_table.identity, new_pids())))],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True)
  return True


def disconnect() -> None:
  """Shuts down the Ray `connect` started, then ends its reaper (which ends any
  of that Ray's processes still running).

  A local Ray's autoscaler monitor, which holds nothing to save, is killed
  first: `ray.shutdown()` would SIGTERM it after ending the GCS, and wait a
  second for its report to the gone GCS, nearly all of a local shutdown.
  """
  global _reaper
  import ray

  reaper, _reaper = _reaper, None
  try:
    from ray._private import ray_constants
    from ray._private import worker

    node = getattr(worker, "_global_node", None)  # None unless this process started a node
    for info in (node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, ())
                 if node is not None else ()):
      if info.process.poll() is None:
        info.process.kill()
        info.process.wait()
    ray.shutdown()
  finally:
    if reaper is not None:
      reaper.stdin.close()
      reaper.wait()


@contextlib.contextmanager
def ray_session(address: Optional[str], resources: Optional[dict] = None):
  """`connect(address, resources)` for the duration of a block; shuts down only
  what it started."""
  import ray

  started = connect(address, resources)
  try:
    yield ray
  finally:
    if started:
      disconnect()
