"""Where rounds run: the execution backend, TensorFlow's threads and devices.

Three backends (`runtime.backend`):

* `inprocess` (what `auto` means): TFF compiles the learning process to its
  MapReduceForm and its TensorFlow parts run in this Python process
  (`inprocess.InProcessLearningProcess`), on the GPUs TensorFlow sees, with no
  child process and no open port.
* `tff_cpp`: TFF's own C++ runtime, kept as the reference. It runs every
  TensorFlow computation in a `worker_binary` child process that is built
  without CUDA and listens on all network interfaces. What it needs to be
  safe to use is installed only when it is chosen (`use_tff_cpp`):
  - the worker is started under `setpriv --pdeathsig KILL`, so that the kernel
    ends it with this process, even after SIGKILL;
  - at exit the execution context is released while Python is still whole (its
    own `__del__` runs too late at interpreter shutdown and leaves the worker
    running, holding this process's stdout/stderr open), and the workers it
    started are killed if they have not ended within `RELEASE_TIMEOUT_S`.
  Only the workers that TFF started here are ever signalled.
* `ray`: the clients of each round run on Ray actors (`ray_backend`), the
  server's parts in this process; a local Ray is bound to 127.0.0.1 and shut
  down with the run.

Nothing here installs a signal handler: the CLI does that for itself.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import threading
from typing import Optional, Sequence

from tff_fedadamom import processes
from tff_fedadamom.config.schema import (INPROCESS, RAY, RAY_CPUS_PER_WORKER,  # noqa: F401
                                         RAY_GPUS_PER_WORKER, RAY_WORKERS, TFF_CPP)
from tff_fedadamom.config.schema import resolved_backend as backend  # noqa: F401
# What summary.json names as the device of tff_cpp rounds.
TFF_CPP_DEVICE = "CPU (TFF worker_binary)"

_INSTALLED = False
_LOCK = threading.Lock()
# Pids of the worker_binary processes TFF started in this process.
_WORKERS: set[int] = set()


def ray_workers(runtime_config) -> dict:
  """The ray backend's settings, nulls resolved: workers, CPUs and GPUs per
  worker, address, threads and concurrent clients per worker."""
  cpus = runtime_config.cpus_per_worker or RAY_CPUS_PER_WORKER
  return dict(workers=runtime_config.workers or RAY_WORKERS, cpus_per_worker=cpus,
              gpus_per_worker=runtime_config.gpus_per_worker or RAY_GPUS_PER_WORKER,
              address=runtime_config.address, threads=runtime_config.threads,
              max_concurrent_clients=runtime_config.max_concurrent_clients)


def kill_workers(sig: int = signal.SIGKILL) -> int:
  """Sends `sig` to the TFF workers started in this process that still run."""
  count = 0
  for pid in processes.still_running(sorted(_WORKERS)):
    try:
      os.kill(pid, sig)
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
  except Exception:  # noqa: BLE001 - best effort; kill_workers follows regardless
    pass


# How long a clean stop of TFF's worker may take before it is killed.
RELEASE_TIMEOUT_S = 10.0


def shutdown(timeout_s: float = RELEASE_TIMEOUT_S) -> None:
  """Stops TFF's worker cleanly, then ends any worker still running.

  TFF stops its worker with SIGINT and an unbounded `wait()`. A worker that ignores
  SIGINT, as every process started from a background job of a non-interactive shell
  does (it inherits the ignored disposition), would hang this process forever.
  After `timeout_s` a watchdog kills the workers, which ends that wait.
  """
  watchdog = threading.Timer(timeout_s, kill_workers)
  watchdog.daemon = True
  watchdog.start()
  try:
    _release_tff_context()
  finally:
    watchdog.cancel()
  kill_workers()


# What sizes the worker_binary's own TensorFlow: one thread per kernel.
WORKER_THREADS_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "OMP_NUM_THREADS": "1"}


def _track_workers() -> None:
  """Records the pid of every worker_binary TFF starts, under `setpriv --pdeathsig KILL`
  when util-linux has it, with single-threaded kernels (`WORKER_THREADS_ENV`).

  TFF starts the worker with `subprocess.Popen` from its `executor_factory`
  module; that module alone gets a `Popen` that records (and prefixes) it.
  """
  import shutil
  import subprocess
  import types

  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory

  setpriv = shutil.which("setpriv")

  class _Popen(subprocess.Popen):

    def __init__(self, args, *rest, **kwargs):
      worker = (isinstance(args, (list, tuple)) and args
                and str(args[0]).endswith("worker_binary"))
      if worker and setpriv is not None:
        args = [setpriv, "--pdeathsig", "KILL", "--", *args]
      if worker:
        # Its kernels single-threaded too, like this process's (see session.py).
        kwargs["env"] = {**(kwargs.get("env") or os.environ), **WORKER_THREADS_ENV}
      super().__init__(args, *rest, **kwargs)
      if worker:
        _WORKERS.add(self.pid)

  shim = types.ModuleType("subprocess")
  shim.__dict__.update(subprocess.__dict__)
  shim.Popen = _Popen
  executor_factory.subprocess = shim


def install_worker_cleanup() -> None:
  """Makes sure no worker_binary that TFF starts here outlives this process."""
  global _INSTALLED
  with _LOCK:
    if _INSTALLED:
      return
    _INSTALLED = True
  try:
    _track_workers()
  except Exception:  # noqa: BLE001 - TFF internals moved: the exit handler still applies
    pass
  atexit.register(shutdown)


def use_tff_cpp(max_concurrent_clients: Optional[int] = None) -> None:
  """Installs TFF's local C++ execution context (the `tff_cpp` backend).

  `max_concurrent_clients` bounds how many client computations run at once
  (TFF's `max_concurrent_computation_calls`); None keeps TFF's default.
  """
  import tensorflow_federated as tff

  install_worker_cleanup()
  tff.backends.native.set_sync_local_cpp_execution_context(
      max_concurrent_computation_calls=max_concurrent_clients or -1)


def round_devices(runtime_config, source: str = "<config>") -> list[str]:
  """The TensorFlow devices the rounds of a run will use (tff_cpp: the worker's CPU;
  ray: one label per actor, 'ray worker K (CPU|GPU)').

  Raises:
    ConfigError: naming `runtime.devices` when TensorFlow does not see one of them.
  """
  if backend(runtime_config) == TFF_CPP:
    return [TFF_CPP_DEVICE]
  if backend(runtime_config) == RAY:
    settings = ray_workers(runtime_config)
    kind = "GPU" if settings["gpus_per_worker"] else "CPU"
    return [f"ray worker {k} ({kind})" for k in range(settings["workers"])]
  from tff_fedadamom.config import ConfigError
  from tff_fedadamom.pipeline import inprocess

  try:
    return inprocess.resolve_devices(runtime_config.devices)
  except ValueError as e:
    raise ConfigError(source, "runtime.devices", str(e),
                      value=list(runtime_config.devices or ()),
                      allowed=f"devices TensorFlow sees: {inprocess.visible_names()}") from None


def training_loop(devices: Sequence[str]):
  """TFF's loop over a client's data for rounds on `devices`: the iterator loop.

  TFF's other loop, `dataset.reduce`, instantiates (and optimizes with
  Grappler) its training step afresh on every call: on a small model that is
  most of a client's time (digits/logistic: about 5x its training). The
  iterator loop is part of the client computation's own graph, optimized once
  when that is first called, and it lets the training ops follow the model
  onto a GPU. Both run the same arithmetic on the same batches (a run's
  weights are bit-identical either way on the CPU); seeded dropout keeps its
  step in a model variable (`models._common.SeededDropout`), so its masks do
  not depend on which compiled copy ran the client.
  """
  del devices  # the same loop everywhere
  import tensorflow_federated as tff

  return tff.learning.LoopImplementation.DATASET_ITERATOR


class TffCppRounds:
  """A TFF learning process on TFF's own runtime whose rounds take client ids.

  TFF's runtime takes datasets; they are built from the run's `ClientTensors`,
  whose example tensors are made once per client, rather than anew each round.
  Every other attribute is the process's own.
  """

  takes_client_ids = True

  def __init__(self, process, client_tensors):
    self._process = process
    self._client_tensors = client_tensors

  def next_for_clients(self, state, client_ids: Sequence, round_num: int):
    return self._process.next(state, self._client_tensors.datasets(client_ids, round_num))

  def __getattr__(self, name):
    return getattr(self._process, name)


def executable(process, runtime_config, devices: Sequence[str], experiment=None,
               client_tensors=None):
  """The object whose `initialize`/`next`/`get_model_weights`/... the runner calls.

  `inprocess`: the process compiled to run here, on `devices`; `tff_cpp`: the
  process itself, with TFF's C++ context installed (with `client_tensors`,
  wrapped so that its rounds take client ids too); `ray`: the process compiled
  here, its clients on Ray actors that load `experiment`'s data (its rounds
  are `next_for_clients(state, client_ids, round_num)`).
  """
  if backend(runtime_config) == TFF_CPP:
    use_tff_cpp(runtime_config.max_concurrent_clients)
    return process if client_tensors is None else TffCppRounds(process, client_tensors)
  if backend(runtime_config) == RAY:
    from tff_fedadamom.pipeline import ray_backend

    if experiment is None:
      raise ValueError("the ray backend needs the experiment config (experiment=...)")
    return ray_backend.RayLearningProcess(process, experiment, **ray_workers(runtime_config))
  from tff_fedadamom.pipeline import inprocess

  return inprocess.InProcessLearningProcess(
      process, devices=devices, max_concurrent_clients=runtime_config.max_concurrent_clients,
      client_tensors=client_tensors)
