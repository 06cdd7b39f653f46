"""Process-level runtime: TensorFlow logging, TFF execution context, child-process cleanup.

TFF's C++ execution context starts a ``worker_binary`` child process. Its owner (the
context's service manager) is torn down in ``__del__`` too late at interpreter exit, so the
worker can outlive Python and keep the parent's stdout/stderr pipes open, hanging whatever
waits on them. ``install_child_cleanup`` ends this process's own children explicitly at
exit and on SIGTERM/SIGINT.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_INSTALLED = False
_LOCK = threading.Lock()


def _child_pids(pid: int) -> list[int]:
  """Returns the pids of every descendant of ``pid`` (Linux /proc walk)."""
  children: dict[int, list[int]] = {}
  try:
    entries = os.listdir("/proc")
  except OSError:
    return []
  for entry in entries:
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", "rb") as f:
        stat = f.read().decode(errors="replace")
      # Field 4 (ppid) follows the parenthesised command name, which may hold spaces.
      ppid = int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
      continue
    children.setdefault(ppid, []).append(int(entry))
  found, stack = [], [pid]
  while stack:
    for child in children.get(stack.pop(), []):
      found.append(child)
      stack.append(child)
  return found


def still_running(pids) -> list[int]:
  """The pids among `pids` that still run (a zombie counts as ended)."""
  alive = []
  for pid in pids:
    try:
      with open(f"/proc/{pid}/stat", "rb") as f:
        state = f.read().decode(errors="replace").rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
      continue
    if state != "Z":
      alive.append(pid)
  return alive


def child_pids(pid: int) -> list[int]:
  """Every descendant of process `pid`."""
  return _child_pids(pid)


def kill_children(sig: int = signal.SIGKILL) -> int:
  """Sends ``sig`` to every descendant of this process; returns how many were signalled."""
  count = 0
  for child in _child_pids(os.getpid()):
    try:
      os.kill(child, sig)
      count += 1
    except OSError:
      pass
  return count


def _release_tff_context() -> None:
  """Drops TFF's default execution context while Python is still whole, so that
  its service manager stops the worker itself instead of failing in a late
  `__del__` at interpreter shutdown."""
  if "tensorflow_federated" not in sys.modules:
    return
  try:
    from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
    from tensorflow_federated.python.core.impl.context_stack import runtime_error_context

    context_stack_impl.context_stack.set_default_context(
        runtime_error_context.create_runtime_error_context())
    gc.collect()
  except Exception:  # noqa: BLE001 - best effort; kill_children follows regardless
    pass


# How long a clean stop of TFF's worker may take before it is killed.
RELEASE_TIMEOUT_S = 10.0


def shutdown(timeout_s: float = RELEASE_TIMEOUT_S) -> None:
  """Stops TFF's worker cleanly, then ends any child process still running.

  TFF stops its worker with SIGINT and an unbounded `wait()`. A worker that ignores
  SIGINT, as every process started from a background job of a non-interactive shell
  does (it inherits the ignored disposition), would hang this process forever, the
  likely cause of a process pool's worker that hung at exit. After `timeout_s` a
  watchdog kills the children, which ends that wait.
  """
  watchdog = threading.Timer(timeout_s, kill_children)
  watchdog.daemon = True
  watchdog.start()
  try:
    _release_tff_context()
  finally:
    watchdog.cancel()
  kill_children()


def _on_signal(signum, frame):  # pragma: no cover - exercised through subprocess tests
  kill_children()
  previous = _PREVIOUS_HANDLERS.get(signum)
  if callable(previous):
    previous(signum, frame)
  elif signum == signal.SIGINT:
    raise KeyboardInterrupt
  else:
    os._exit(128 + signum)


_PREVIOUS_HANDLERS: dict[int, object] = {}


def _tie_worker_to_parent() -> None:
  """Starts TFF's worker_binary under `setpriv --pdeathsig KILL`.

  The kernel then kills the worker when this process dies, even by SIGKILL, when
  no exit handler can run. TFF starts the worker with `subprocess.Popen` from its
  `executor_factory` module; that module alone gets a `Popen` that prefixes the
  command. Without `setpriv` (util-linux) the exit handlers below still apply.
  """
  import shutil
  import subprocess
  import types

  setpriv = shutil.which("setpriv")
  if setpriv is None:
    return
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory

  class _Popen(subprocess.Popen):

    def __init__(self, args, *rest, **kwargs):
      if isinstance(args, (list, tuple)) and args and str(args[0]).endswith("worker_binary"):
        args = [setpriv, "--pdeathsig", "KILL", "--", *args]
      super().__init__(args, *rest, **kwargs)

  shim = types.ModuleType("subprocess")
  shim.__dict__.update(subprocess.__dict__)
  shim.Popen = _Popen
  executor_factory.subprocess = shim


def install_child_cleanup() -> None:
  """Makes sure no child process (TFF's worker_binary) outlives this process."""
  global _INSTALLED
  with _LOCK:
    if _INSTALLED:
      return
    _INSTALLED = True
  try:
    _tie_worker_to_parent()
  except Exception:  # noqa: BLE001 - TFF internals moved: fall back to exit handlers
    pass
  atexit.register(shutdown)
  if threading.current_thread() is threading.main_thread():
    for signum in (signal.SIGTERM,):
      _PREVIOUS_HANDLERS[signum] = signal.getsignal(signum)
      signal.signal(signum, _on_signal)


def configure_threads(threads: int | None) -> None:
  """Sizes TensorFlow's thread pools (must run before TensorFlow starts work)."""
  if not threads:
    return
  import tensorflow as tf

  try:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(threads, 2)))
  except RuntimeError:  # TensorFlow already initialized: keep its pools.
    pass


def configure_devices() -> list[str]:
  """Turns on GPU memory growth; returns the devices TensorFlow will use."""
  import tensorflow as tf

  for gpu in tf.config.list_physical_devices("GPU"):
    try:
      tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:
      pass
  gpus = tf.config.list_physical_devices("GPU")
  return [d.name for d in gpus] or [d.name for d in tf.config.list_physical_devices("CPU")]


def set_execution_context(max_concurrent_clients: int | None) -> None:
  """Installs TFF's local C++ execution context.

  `max_concurrent_clients` bounds how many client computations run at once
  (TFF's `max_concurrent_computation_calls`); None keeps TFF's default.
  """
  import tensorflow_federated as tff

  install_child_cleanup()
  tff.backends.native.set_sync_local_cpp_execution_context(
      max_concurrent_computation_calls=max_concurrent_clients or -1)
