"""The driver's node template: the trial workers of this node forked from a copy
of the sweep's driver, which has imported TensorFlow and TFF already, instead of
from a new process that imports them again.

Why: a sweep's driver imports TensorFlow and TFF anyway (checking the sweep's
experiments imports them), and a sweep's workers were forked from a template that
imported them once more, on CPUs the sweep's first trials and Tune's start
needed: 2.2 s of work on the quickstart sweep's critical path, on 2 cores
(`benchmarks/sweep_scaling.py`, section 0). A fork of the driver is ready in
milliseconds.

A process is forked as a template that imported would be (`_fork_safe`): with
TensorFlow's runtime not started (its thread pools would not survive the fork)
and no thread of its own running, so before Ray connects (Ray's client runs
threads) and before any TensorFlow op.
`sweep_session` forks the template there, then starts or joins Ray; a driver
already connected, or with TensorFlow's runtime started, gets None, and its
sweeps' hosts start templates of their own (`tuning.hosts`).

The template is `multiprocessing`'s fork server loop (`forkserver.main`) run in
the fork: the local `hosts.WorkerHost` connects to it as to the fork server it
would otherwise start (`hosts._attach`). It runs in a process group of its own,
without the driver's signal handlers; it ends with the driver
(`PR_SET_PDEATHSIG`) and at the end of the session (SIGKILL), and never runs the
driver's exit handlers (`os._exit`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import importlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from multiprocessing import forkserver
from typing import Iterator, Optional

from tff_fedadamom import process_table

# What trial workers run, imported before any of them is forked: by a template
# of its own (`tuning.worker_imports`), or by the driver before forking.
WORKER_MODULES = ("tff_fedadamom.experiment.runner", "tuning.hosts")
_PR_SET_PDEATHSIG = 1
# The template of this process's current session (`sweep_session`), if any.
_CURRENT: list["Template"] = []


@dataclasses.dataclass(frozen=True)
class Template:
  """A node template: its fork server's socket, and its process."""
  address: str
  identity: tuple[int, int]  # the template's process (`process_table.identity`)

  def running_here(self) -> bool:
    """True in a process of the template's machine while the template runs."""
    return process_table.identity(self.identity[0]) == self.identity


def current() -> Optional[Template]:
  """The template of the `sweep_session` this process runs in, if it has one alive."""
  template = _CURRENT[-1] if _CURRENT else None
  return template if template is not None and template.running_here() else None


def _import_thread(thread: threading.Thread) -> bool:
  """True for the thread TFF's import starts (its default context's event loop,
  `async_utils.AsyncThreadRunner`), which a template of its own has as well:
  the fork runs without it, as forked workers always have."""
  target = getattr(thread, "_target", None)
  return thread.daemon and "AsyncThreadRunner" in getattr(target, "__qualname__", "")


def _fork_safe() -> bool:
  """True while this process is what a template that imports is when it forks:
  not connected to Ray, TensorFlow's runtime not started, and no Python thread
  but the main one and TFF's import's (`_import_thread`)."""
  ray = sys.modules.get("ray")
  if ray is not None and ray.is_initialized():
    return False
  eager = sys.modules.get("tensorflow.python.eager.context")
  context = getattr(eager, "_context", None) if eager else None
  if context is not None and getattr(context, "_context_handle", None) is not None:
    return False
  main = threading.main_thread()
  return threading.current_thread() is main and all(
      t is main or _import_thread(t) for t in threading.enumerate())


def _serve(listener: socket.socket, alive_r: int, driver: int) -> None:
  """The template's whole life, in the fork (never returns)."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != driver:  # the driver ended before the call above
      os._exit(0)
    # A process group of its own: a Ctrl-C at the driver's terminal reaches the
    # driver, which ends the sweep, and not the workers, as with Ray's processes.
    os.setpgid(0, 0)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
      signal.signal(sig, signal.SIG_DFL)  # not the driver's handlers
    gc.freeze()  # the workers share the driver's imports' pages, never walked
    forkserver.main(listener.fileno(), alive_r, [])
  except BaseException:  # noqa: BLE001 - nothing of the driver's may run here
    os._exit(1)
  os._exit(0)


@contextlib.contextmanager
def node_template() -> Iterator[Optional[Template]]:
  """Forks this process into a node template for the block (see the module doc);
  yields it, or None where forking is not safe (`_fork_safe`)."""
  if not _fork_safe():
    yield None
    return
  for name in WORKER_MODULES:  # (the driver's garbage collector is left as it is)
    importlib.import_module(name)

  folder = tempfile.mkdtemp(prefix="tff-template-")
  address = os.path.join(folder, "socket")
  listener = socket.socket(socket.AF_UNIX)
  listener.bind(address)
  os.chmod(address, 0o600)
  listener.listen()
  alive_r, alive_w = os.pipe()
  driver = os.getpid()
  for stream in (sys.stdout, sys.stderr):  # or the fork would write their buffers again
    with contextlib.suppress(Exception):
      stream.flush()
  pid = os.fork()
  if pid == 0:
    os.close(alive_w)
    _serve(listener, alive_r, driver)
  os.close(alive_r)
  listener.close()
  template = Template(address, process_table.identity(pid))
  _CURRENT.append(template)
  try:
    yield template
  finally:
    _CURRENT.remove(template)
    os.close(alive_w)
    with contextlib.suppress(ProcessLookupError):
      os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # reaped already (a caller's own wait)
      os.waitpid(pid, 0)
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def sweep_session(address: Optional[str], resources: Optional[dict] = None):
  """`ray_session(address, resources)` for sweeps: when this process is not yet
  connected to Ray, it first forks itself into this node's template
  (`node_template`), which every sweep run in the session forks its local
  workers from. Yields the template, or None."""
  import ray

  from tff_fedadamom.runtime.ray_session import ray_session

  with contextlib.ExitStack() as stack:
    template = stack.enter_context(node_template()) if not ray.is_initialized() else None
    stack.enter_context(ray_session(address, resources))
    yield template
