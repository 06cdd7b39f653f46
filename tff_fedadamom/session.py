"""Process-wide TensorFlow settings, owned by an entry point.

TensorFlow sizes its thread pools once per process, before its first op, so
the entry points (the command, a sweep trial, a Ray actor, a test session)
apply them with `Session(...).apply()`, which also sets the environment
variables the process and its children need; no library call edits `os.environ`.

Why kernels run single-threaded: a multi-threaded kernel splits its reductions
by the thread count, so float round-off, amplified by training, made a run's
numbers depend on the machine's cores. With one thread per kernel and the
cores spent on clients side by side, a run is a function of its config.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import gc
import os
import sys
from typing import Callable, Mapping, Optional


def cpu_count() -> int:
  """The CPUs this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def release_tff_default_context() -> None:
  """Replaces the C++ execution context importing TFF installs as its default
  (the project never runs on it) by TFF's runtime-error context.

  Why, at exit: its service manager's `__del__` looks up `subprocess.Popen` in
  its module's globals. After a program traced TensorFlow functions, TFF's
  modules live until the interpreter's last stage, which sets those globals to
  None first, and the lookup fails ("'NoneType' object has no attribute 'Popen'").
  """
  if "tensorflow_federated" not in sys.modules:
    return
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from tensorflow_federated.python.core.impl.context_stack import runtime_error_context

  context_stack_impl.context_stack.set_default_context(
      runtime_error_context.create_runtime_error_context())


# AutoGraph names the module of each function it converts after the file it
# writes the converted source to: <temp dir>/__autograph_generated_file<random>.py.
_AUTOGRAPH_PREFIX = "__autograph_generated_file"


def autograph_files() -> list[str]:
  """The source files AutoGraph wrote for the functions this process converted."""
  return [module.__file__ for name, module in list(sys.modules.items())
          if name.startswith(_AUTOGRAPH_PREFIX)
          and os.path.basename(getattr(module, "__file__", None) or "") == name + ".py"]


def remove_autograph_files() -> list[str]:
  """Removes `autograph_files()`; returns their paths. For a process about to end
  by a signal or `os._exit`, which never reaches AutoGraph's own removal at exit.
  The converted code runs on; tracebacks lose its source lines."""
  removed = []
  for path in autograph_files():
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
      removed.append(path)
  return removed


@functools.cache
def release_tff_at_exit() -> None:
  """Registers `release_tff_default_context` to run at this process's exit (once)."""
  atexit.register(release_tff_default_context)


@contextlib.contextmanager
def startup_imports(enabled: bool = True):
  """For an entry point's start-up imports (TensorFlow, TFF, the pipeline): the
  cyclic garbage collector is off during the block, and every object alive at
  its end is frozen out of later collections (`gc.freeze`). `enabled` False
  changes nothing (a command called by a caller's program).

  Why: those imports make hundreds of thousands of objects that live as long as
  the process, and every full collection would walk them all again.
  """
  if not enabled:
    yield
    return
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    gc.freeze()
    if was_enabled:
      gc.enable()


# Seconds between `exit_when`'s checks.
PARENT_POLL_S = 0.5
_WATCHING: list = []  # what this process already watches, each once


def exit_when(gone: Callable[[], bool], what) -> None:
  """Ends this process (`os._exit`) once `gone()` holds, checked every
  `PARENT_POLL_S` by a daemon thread, after removing the AutoGraph sources
  (best effort). `what` names the watch: each starts once per process. For an
  entry point only."""
  import threading
  import time

  if what in _WATCHING:
    return
  _WATCHING.append(what)

  def watch():
    while not gone():
      time.sleep(PARENT_POLL_S)
    with contextlib.suppress(Exception):  # best effort: the process ends either way
      remove_autograph_files()
    os._exit(1)  # noqa: SLF001 - no one is left to report to

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class SessionError(RuntimeError):
  """TensorFlow's process-wide settings are not (or can no longer be) what a run needs."""


@dataclasses.dataclass(frozen=True)
class Session:
  """What an entry point sets for its whole process.

  Attributes:
    threads: TensorFlow's inter-op pool, which runs clients side by side; None:
      every CPU of the process. Each kernel runs on one thread.
    environ: Environment variables for this process and its children, set
      before TensorFlow starts.
    exit_with_parent: End this process once its parent is gone: for workers a
      killed parent cannot stop, such as a Ray actor whose raylet died (polled
      by a thread, which runs during TensorFlow calls too: they release the GIL).
  """

  threads: Optional[int] = None
  gpu_memory_growth: bool = True
  environ: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
  exit_with_parent: bool = False

  @property
  def inter_op_threads(self) -> int:
    return self.threads or cpu_count()

  def apply(self) -> "Session":
    """Sizes TensorFlow's thread pools (and GPU memory growth) for this process,
    and releases TFF's default context at its exit. Idempotent for the same
    settings; SessionError if TensorFlow already started with other ones."""
    os.environ.update(self.environ)
    release_tff_at_exit()
    if self.exit_with_parent:
      parent = os.getppid()
      exit_when(lambda: os.getppid() != parent, ("parent", parent))
    import tensorflow as tf

    threading = tf.config.threading
    want = (1, self.inter_op_threads)
    have = (threading.get_intra_op_parallelism_threads(),
            threading.get_inter_op_parallelism_threads())
    if have == want:
      return self
    try:
      threading.set_intra_op_parallelism_threads(want[0])
      threading.set_inter_op_parallelism_threads(want[1])
    except RuntimeError:
      raise SessionError(
          f"TensorFlow already runs with {have[0] or 'all'} intra-op and {have[1] or 'default'} "
          f"inter-op threads; the run needs 1 and {want[1]}. Apply "
          "tff_fedadamom.Session(threads=...).apply() at the start of the program, before "
          "TensorFlow runs anything") from None
    if self.gpu_memory_growth:
      for gpu in tf.config.list_physical_devices("GPU"):
        # A RuntimeError: TensorFlow already initialized its GPUs; keep them as they are.
        with contextlib.suppress(RuntimeError):
          tf.config.experimental.set_memory_growth(gpu, True)
    return self


_WARNED: list = []  # the kernel-thread warning, given once per process


def kernel_threads() -> int:
  """The threads each TensorFlow kernel of this process may use (its intra-op
  pool; TensorFlow's default 0 reads as every CPU). A library run records it
  and goes on; with more than one (see the module docstring) it warns once."""
  import logging

  import tensorflow as tf

  threads = tf.config.threading.get_intra_op_parallelism_threads() or cpu_count()
  if threads != 1 and not _WARNED:
    _WARNED.append(threads)
    logging.getLogger("tff_fedadamom").warning(
        "TensorFlow runs each kernel on %d threads here, so this run's numbers can differ "
        "slightly from the same config run by `tff-fedadamom run`, which uses one. For the "
        "command's numbers, call tf.config.threading.set_intra_op_parallelism_threads(1) "
        "before TensorFlow runs anything.", threads)
  return threads
