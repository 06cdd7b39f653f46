"""A node's trial workers, forked from one process that has imported what they
run: a sweep pays TensorFlow's and TFF's imports once per node, not once per
worker.

Why: a worker's start is mostly its imports (3.3-3.5 s for TensorFlow, TFF and
the pipeline while another process does the same, on 2 cores), and on a
machine whose cores all run trials, two workers importing side by side cost
the sweep what they take from its first trials. Measured on the quickstart
sweep with a warm process cache (`benchmarks/sweep_scaling.py`, section 0):
warm workers took 7.8 s; with two processes importing TensorFlow and TFF
beside them, as two new workers do, 11.6 s; with one, 9.0 s.

The pieces:
  * `WorkerHost`, a Ray actor per node, started for the pool
    (`pools.start_host`). It starts a template process, `multiprocessing`'s
    fork server, which imports `tuning.worker_imports` and then forks each
    worker the host asks for. On the driver's node, a driver that forked
    itself into a template before Ray connected (`tuning.template`, as
    `run_sweep` and `tff-fedadamom tune` do) hands the host that one instead,
    which has nothing left to import. A worker runs one `tuning.workers.TrialWorker`,
    served to the host by a `multiprocessing` manager over a Unix socket; the
    host relays the pool's and the trials' calls to it (`call`).
  * `WorkerRef`, (host, worker id): what the pool hands a trial.

A forked worker applies its trial's session first (`workers.worker_env`: its
thread pools and visible GPUs), before TensorFlow starts: the template runs no
op and lists no device, so each worker sizes TensorFlow as a new process would.

Lifetimes. Each worker ends when its host's process does (`session.exit_when`;
its parent is the fork server, not the host), and the fork server
once its host and workers have (it watches a pipe that only they hold open):
a host ended by `ray.kill`, or a node's Ray stopped, leaves nothing behind (the
driver's template ends with the driver's session instead). A
worker that dies makes the host's calls to it raise `WorkerLost`; the pool then
drops it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import os
import shutil
import signal
import threading
from multiprocessing import managers, util
from typing import Any, Sequence

from ray import cloudpickle

from tff_fedadamom import process_table
from tuning.workers import TrialWorker, worker_env

# The module the template imports before it forks (its whole start-up).
TEMPLATE_IMPORTS = "tuning.worker_imports"


class WorkerLost(RuntimeError):
  """A trial worker's process has ended (or never started): its trial is lost."""


class _InProcess:
  """Runs a pickled `(fn, args)` in a worker's process (`WorkerHost.run`)."""

  def call(self, pickled: bytes):
    fn, args = cloudpickle.loads(pickled)
    return fn(*args)


def _worker_session(threads: int, gpu_ids: Sequence[str], host: tuple[int, int]) -> None:
  """A forked worker's first step, before TensorFlow starts: its trial's
  session. The worker ends with its host (`host`: the host's identity), and
  then removes the host's `multiprocessing` directory (the fork server's and
  the managers' sockets), which a host ended by a signal leaves behind.

  The worker's temporary files go to that directory too: the sources AutoGraph
  writes for a worker are removed at its exit, which a worker killed by a
  signal never reaches (the kill test of `tests/tuning/test_workers.py` left
  31 in /tmp); there they go with the host."""
  import tempfile

  from tff_fedadamom.session import Session, exit_when

  scratch = util.get_temp_dir()  # the host's, inherited: not made here
  tempfile.tempdir = scratch  # the worker is its process's entry point
  for fd in (1, 2):  # the host's output (Ray's log of it), as a template of its own has it
    with contextlib.suppress(OSError):
      target = os.open(f"/proc/{host[0]}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
      os.dup2(target, fd)
      os.close(target)
  Session(threads=threads, environ={**worker_env(threads, gpu_ids), "TMPDIR": scratch}).apply()
  exit_when(lambda: process_table.identity(host[0]) != host, host, also_remove=[scratch])


def _start_own_fork_server() -> None:
  """Starts this process's own `multiprocessing` fork server, which imports
  what the workers run (`TEMPLATE_IMPORTS`) while the first workers are asked for."""
  from multiprocessing import forkserver

  forkserver.set_forkserver_preload([TEMPLATE_IMPORTS])
  forkserver.ensure_running()


def _attach(template) -> None:
  """Makes this process's `multiprocessing` fork server `template`'s (a
  `tuning.template.Template`, not this process's child): for a `WorkerHost`,
  whose process it is. Should the template end first (its session's end, a
  kill), the next worker's start starts a fork server of this process's own,
  which imports, as a host on another node has.

  Each worker is passed the write end of an "alive" pipe of this process's (the
  fork server's protocol); the template ends with its session, not with the pipe."""
  from multiprocessing import forkserver, resource_tracker

  # This host's `multiprocessing` directory, made now as a fork server's start
  # makes it: each worker inherits it (`_worker_session`), and `shutdown`
  # removes it. A worker that made its own would leave it behind when killed.
  util.get_temp_dir()
  server = forkserver._forkserver  # noqa: SLF001 - the module's one instance
  _, alive_w = os.pipe()
  server._forkserver_address = template.address  # noqa: SLF001
  server._forkserver_alive_fd = alive_w  # noqa: SLF001
  server._forkserver_pid = None  # noqa: SLF001 - not this process's child

  def ensure_running() -> None:
    # In place of the server's own check (`waitpid`), which needs a child.
    if template.running_here():
      resource_tracker.ensure_running()
      return
    del server.ensure_running  # the server's own again
    os.close(alive_w)
    server._forkserver_address = server._forkserver_alive_fd = None  # noqa: SLF001
    _start_own_fork_server()

  server.ensure_running = ensure_running


class _WorkerManager(managers.BaseManager):
  """Serves a forked worker's `TrialWorker` (and `_InProcess`) to its host."""


_WorkerManager.register("TrialWorker", TrialWorker)
_WorkerManager.register("InProcess", _InProcess)


@dataclasses.dataclass(frozen=True)
class _Worker:
  manager: _WorkerManager
  trials: Any  # the manager's proxy of the worker's TrialWorker
  identity: tuple[int, int]  # the worker's process (`process_table.identity`)

  def running(self) -> bool:
    return process_table.identity(self.identity[0]) == self.identity


@dataclasses.dataclass(frozen=True)
class WorkerRef:
  """A worker of a `WorkerHost`: `call` is the worker's method call, as an ObjectRef."""
  host: Any  # the WorkerHost actor's handle
  wid: str

  def call(self, method: str, *args):
    return self.host.call.remote(self.wid, method, *args)


class WorkerHost:
  """Forks a node's trial workers from one template process (see the module doc)."""

  def __init__(self, template=None):
    # The fork server is this process's (the host is its entry point): the
    # driver's node template (`tuning.template`) when it runs on this machine,
    # else one started here.
    self._context = multiprocessing.get_context("forkserver")
    if template is not None and template.running_here():
      _attach(template)
    else:
      _start_own_fork_server()
    self._identity = process_table.identity(os.getpid())
    self._lock = threading.Lock()
    self._workers: dict[str, concurrent.futures.Future] = {}

  def _future(self, wid: str) -> concurrent.futures.Future:
    # A threaded actor may run a worker's first call before its start: both meet here.
    with self._lock:
      return self._workers.setdefault(wid, concurrent.futures.Future())

  def start_worker(self, wid: str, threads: int, gpu_ids: Sequence[str],
                   parts_per_worker: int, warm: bytes) -> int:
    """Forks worker `wid` for trials of `threads` threads on GPUs `gpu_ids`
    (`TrialWorker(parts_per_worker)`, warming up the pickled `warm` if any);
    returns its pid."""
    future = self._future(wid)
    try:
      manager = _WorkerManager(ctx=self._context)
      manager.start(_worker_session, (threads, list(gpu_ids), self._identity))
      trials = manager.TrialWorker(parts_per_worker)
      if warm:
        trials.add_warm(parts_per_worker, warm)
      pid = manager.InProcess().call(cloudpickle.dumps((os.getpid, ())))
      identity = process_table.identity(pid)
      if identity is None:
        raise WorkerLost(f"trial worker {pid} ended as it started")
      worker = _Worker(manager, trials, identity)
    except BaseException as error:
      future.set_exception(WorkerLost(f"a trial worker could not start: {error!r}"))
      raise
    future.set_result(worker)
    return pid

  def call(self, wid: str, method: str, *args):
    """`method(*args)` of worker `wid`'s `TrialWorker`, in its process.

    Raises:
      WorkerLost: the worker's process has ended, or never started.
    """
    worker = self._future(wid).result()
    try:
      return getattr(worker.trials, method)(*args)
    except (EOFError, OSError) as error:
      if worker.running():  # the method's own error
        raise
      pid = worker.identity[0]
      ended = process_table.stat(pid)
      how = process_table.how_it_ended(ended) if ended is not None else "ended"
      raise WorkerLost(f"trial worker {pid} {how}") from error

  def run(self, wid: str, fn, *args):
    """`fn(*args)` run in worker `wid`'s process, as Ray's `__ray_call__` runs a
    function in an actor's: for a caller that inspects a worker."""
    worker = self._future(wid).result()
    return worker.manager.InProcess().call(cloudpickle.dumps((fn, args)))

  def shutdown(self) -> None:
    """Ends the workers (SIGKILL, which skips their exit handlers), then removes
    this host's `multiprocessing` directory: the sockets of the fork server and
    the managers, and the workers' temporary files (`_worker_session`), the
    sources AutoGraph wrote for them among them."""
    with self._lock:
      futures = list(self._workers.values())
      self._workers.clear()
    for future in futures:
      if not future.done() or future.exception() is not None:
        continue
      worker = future.result()
      if worker.running():  # this host started it; its start time rules out a reused pid
        with contextlib.suppress(ProcessLookupError):
          os.kill(worker.identity[0], signal.SIGKILL)
      worker.manager.shutdown()  # the manager's own end, of a process already gone
    # This process is ended next by a signal (`ray.kill`), which skips
    # `multiprocessing`'s own removal of the directory.
    shutil.rmtree(util.get_temp_dir(), ignore_errors=True)
