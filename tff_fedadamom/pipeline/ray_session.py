"""Connecting to Ray: a local instance on loopback, or an existing cluster.

Shared by the sweeps (`tuning.sweep`) and the `ray` backend of a single
experiment (`backends.ray`). Ray is imported only when a session starts, so
`import tff_fedadamom` never pulls it in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import warnings
from typing import Any, Optional

from tff_fedadamom import process_table
from tff_fedadamom.pipeline import ray_reaper

LOG = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost")
REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_reaper.py")
# The reaper of the local Ray this process started (`ray_reaper`), while it runs.
# Ray's own state is per process too: one local instance at a time.
_reaper: Optional[subprocess.Popen] = None


def is_loopback(address: Optional[str]) -> bool:
  """Whether a Ray address (None: a new local instance) is on this machine's loopback."""
  if address is None:
    return True
  host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
  return host in _LOOPBACK


def _init_kwargs(address: Optional[str], resources: Optional[dict]) -> dict[str, Any]:
  """`ray.init`'s arguments for `connect(address, resources)`."""
  env = {"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
  # configure_logging=False: Ray leaves this process' loggers alone (its own
  # would get a handler and a level for good); its warnings still reach stderr
  # through Python's last-resort handler, or through the caller's logging set-up.
  kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                configure_logging=False, runtime_env={"env_vars": env})
  if address is None:
    # "local": a new instance even if RAY_ADDRESS is set or a `ray start`
    # cluster runs on this machine (ray.init() would silently join those).
    kwargs.update(address="local", _node_ip_address="127.0.0.1", **(resources or {}))
  else:
    kwargs["address"] = address
    if address != "auto" and is_loopback(address):
      kwargs["_node_ip_address"] = "127.0.0.1"
    kwargs.pop("include_dashboard")  # the cluster's own setting applies
  return kwargs


def connect(address: Optional[str], resources: Optional[dict] = None) -> bool:
  """Connects this process to Ray as `address` says; True if it started a session.

  `None` starts a new local Ray bound to 127.0.0.1 with the dashboard off,
  and a reaper (`ray_reaper`) that ends its processes if this one ends without
  `disconnect` (a SIGKILL); `auto` or host:port joins an existing cluster. The
  process' logging is left as it is. An already initialised Ray (a test, a
  notebook, a sweep) is used as it is, and False is returned: the caller must
  then not shut it down.

  `resources` (a new local instance only) are what Ray is told the machine
  has, e.g. `{"num_cpus": 1, "num_gpus": 1}`, instead of what it detects.
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

  def started() -> list:
    """(pid, start time) of each process started since `before` that still runs."""
    return [identity for identity in (process_table.identity(pid)
                                      for pid in process_table.descendants(os.getpid())
                                      if pid not in before) if identity is not None]

  # A local start is tried twice. Three times in this project's test suite,
  # with other tests starting local Rays at the same time, the GCS server of a
  # new local Ray exited, or hung, before writing its log and `ray.init` failed
  # (the hung one after about 35 s of Ray's own retries); the cause was not
  # found (Ray picks its ports by binding and releasing them, so two starts at
  # once can pick the same one). What the failed start left running
  # is ended before the second try.
  for tries_left in range(2 if address is None else 1, 0, -1):
    try:
      with warnings.catch_warnings():
        # Ray's notice that zero-GPU tasks will see the GPUs one day: tasks
        # without a GPU hide them themselves.
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray",
                                category=FutureWarning)
        ray.init(**kwargs)
      break
    except Exception as error:  # noqa: BLE001 - Ray raises many kinds at start
      if tries_left == 1:
        raise
      LOG.warning("a local Ray failed to start (%s: %s); starting it again",
                  type(error).__name__, error)
      ray.shutdown()
      ray_reaper.kill(started())
  if before is not None:
    # -I: the reaper needs the standard library and process_table only.
    _reaper = subprocess.Popen(
        [sys.executable, "-I", REAPER, *(f"{pid}:{t}" for pid, t in started())],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True)
  return True


def disconnect() -> None:
  """Shuts down the Ray `connect` started, then ends its reaper (which ends any
  of that Ray's processes still running)."""
  global _reaper
  import ray

  reaper, _reaper = _reaper, None
  try:
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
