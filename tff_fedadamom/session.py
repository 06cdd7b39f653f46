"""Process-wide TensorFlow settings, owned by an entry point.

TensorFlow's thread pools are sized once per process, before it runs its first
op, and every later request is refused or ignored. So they are not a run's
settings but the process's: the entry points (the `tff-fedadamom` command, a
sweep trial, a Ray actor, a test session) apply them once with
`Session(...).apply()`. A library call needs no set-up: it runs with the
process's settings and records them (`kernel_threads`). The same object sets
the environment variables the process (and the processes it starts, such as
TFF's worker_binary) must have: no library call edits `os.environ`.

Why kernels run single-threaded: a multi-threaded kernel splits its reductions
by the thread count, so float round-off, amplified by training, made a run's
numbers depend on the machine's cores. With one intra-op thread per kernel and the
cores spent on running clients side by side (the natural parallel unit of
federated learning), a run is a function of its config on any CPU machine.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import os
import sys
from typing import Callable, Mapping, Optional, Sequence


def cpu_count() -> int:
  """The CPUs this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def release_tff_default_context() -> None:
  """Replaces the C++ execution context that importing TFF installs as its
  default (on the importing thread; the project never runs on it) by TFF's
  runtime-error context.

  Why, at exit: that context's service manager ends its (never started)
  worker in `__del__` by looking up `subprocess.Popen` in its module's
  globals. When a program has traced TensorFlow functions, TFF's modules stay
  alive until the interpreter's last stage, which sets module globals to None
  before the thread-local context stack is freed, so the lookup fails with
  "AttributeError: 'NoneType' object has no attribute 'Popen'". Released
  while Python is still whole, the manager is freed without error.
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
  """The source files TensorFlow's AutoGraph wrote for the functions this
  process has converted (each one's module is named after its file)."""
  return [module.__file__ for name, module in list(sys.modules.items())
          if name.startswith(_AUTOGRAPH_PREFIX)
          and os.path.basename(getattr(module, "__file__", None) or "") == name + ".py"]


def remove_autograph_files() -> list[str]:
  """Removes the source files TensorFlow's AutoGraph wrote for the functions
  this process has converted (`autograph_files`); returns their paths.

  Why: AutoGraph writes each converted function to a file in the temp
  directory and removes it at interpreter exit (`atexit`), which a process
  ended by a signal or `os._exit` never reaches, so such processes would leave
  their files in the temp directory. For a process about to end that way (an
  `exit_when` watch's last step).
  The converted code stays loaded and runs as before; tracebacks through it
  lose their source lines.
  """
  removed = []
  for path in autograph_files():
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
      removed.append(path)
  return removed


_RELEASING: list = []  # the exit handler, registered once per process


def release_tff_at_exit() -> None:
  """Registers `release_tff_default_context` to run at this process's exit (once)."""
  if not _RELEASING:
    _RELEASING.append(release_tff_default_context)
    atexit.register(release_tff_default_context)


@contextlib.contextmanager
def startup_imports(enabled: bool = True):
  """For an entry point's start-up imports (TensorFlow, TFF, the pipeline):
  Python's cyclic garbage collector is off during the block, and every object
  alive at its end is frozen out of later collections (`gc.freeze`). With
  `enabled` False, nothing is changed (a command called by a caller's program,
  `cli.main`).

  Why: those imports make hundreds of thousands of objects that live as long
  as the process (modules, classes, functions, op registrations). With the
  collector on, each full collection during the imports walks every object
  made so far, and every later one (Python's own, a checkpoint's
  `gc.collect`) walks them all again. Frozen, they are never walked again; the
  little cyclic garbage the imports leave stays allocated.

  For an entry point only: the collector's state is the process's. It is on
  again after the block if it was before.
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


def exit_when(gone: Callable[[], bool], what, also_remove: Sequence[str] = ()) -> None:
  """Ends this process (`os._exit`) once `gone()` holds, checked every
  `PARENT_POLL_S` by a daemon thread; `what` names the watch (each is started
  once per process). Before it ends, it removes the sources AutoGraph wrote for
  this process and the directories `also_remove` (best effort).

  For an entry point only (the process's end is its own): a `Session` with
  `exit_with_parent`."""
  import shutil
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
      for path in also_remove:
        shutil.rmtree(path, ignore_errors=True)
    os._exit(1)  # noqa: SLF001 - no one is left to report to

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class SessionError(RuntimeError):
  """TensorFlow's process-wide settings are not (or can no longer be) what a run needs."""


@dataclasses.dataclass(frozen=True)
class Session:
  """What an entry point sets for its whole process.

  Attributes:
    threads: Threads that run ops of different clients side by side
      (TensorFlow's inter-op pool); None: every CPU of the process. Each
      kernel itself runs on one thread.
    gpu_memory_growth: Let concurrent processes share a GPU.
    environ: Environment variables this process and its children need (a
      sweep trial's thread and GPU settings, `tuning.trainable.trial_environ`,
      which TFF's worker_binary inherits); set first, before TensorFlow
      starts and reads them.
    exit_with_parent: End this process as soon as its parent is gone (it was
      re-parented): for workers whose parent cannot stop them once it is
      killed, such as a Ray actor whose raylet died or a paper-study pool
      worker whose study was killed. A daemon thread of this process polls
      its parent every `PARENT_POLL_S` (a TensorFlow call releases the GIL,
      so it runs during one too).
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
    and releases TFF's default context at its exit (`release_tff_at_exit`).

    Idempotent for the same settings. Raises:
      SessionError: TensorFlow has started with other settings; it cannot
        change them any more, so the process must apply its session first.
    """
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
        try:
          tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # TensorFlow already initialized its GPUs: keep them as they are
          pass
    return self


_WARNED: list = []  # the kernel-thread warning, given once per process


def kernel_threads() -> int:
  """The threads each TensorFlow kernel of this process may use (its intra-op
  pool; 0, TensorFlow's default, reads as every CPU of the process).

  A library run calls this and goes on whatever it is: the pool belongs to the
  process, and TensorFlow fixes it at its first op. With more than one, the
  run's numbers depend on the machine's cores (see the module docstring): the
  run records the count in its summary and warns once.
  """
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
