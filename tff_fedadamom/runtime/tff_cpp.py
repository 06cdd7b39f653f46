"""The `tff_cpp` backend: TFF's own C++ runtime, kept as the reference.

TFF 0.87 runs it only in a separate `worker_binary`; here that runs in a
private network namespace behind a Unix socket (`tff_cpp_relay` says why).

`Runtime` is that worker as a TFF sync context, mirroring TFF's
`create_sync_local_cpp_execution_context` with `local_cpp_executor_factory`
(only the launch and the channel's address differ). `TffCppProcess` wraps a
learning process: each call runs with its `Runtime` installed on the calling
thread's context stack, for that call only.

Lifetime: the worker_binary starts on the first invocation and ends with
`close()` (SIGTERM to its process group, SIGKILL after `STOP_TIMEOUT_S`), when
the runtime is collected, or when this process ends, however it ends (the relay
ends when its stdin, a pipe from this process, closes).
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Optional, Sequence

from tensorflow_federated.python.core.impl.context_stack import context_base

from tff_fedadamom import process_table
from tff_fedadamom.config.schema import INPROCESS, RAY, TFF_CPP

# What summary.json names as the device of tff_cpp rounds.
TFF_CPP_DEVICE = "CPU (TFF worker_binary)"
RELAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tff_cpp_relay.py")
# How long the worker_binary may take to start, and to stop before it is killed.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
# TFF's `local_cpp_executor_factory` defaults (TFF 0.87).
_DEFAULT_NUM_CLIENTS = 0
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_OPTIONS = [("grpc.max_message_length", _GRPC_MAX_MESSAGE_BYTES),
                 ("grpc.max_receive_message_length", _GRPC_MAX_MESSAGE_BYTES),
                 ("grpc.max_send_message_length", _GRPC_MAX_MESSAGE_BYTES)]


def _relay_command(*args: str) -> list[str]:
  # -I: the relay needs the standard library only, not this environment's path.
  return [sys.executable, "-I", RELAY, *args]


@functools.lru_cache(maxsize=None)
def namespace_problem() -> Optional[str]:
  """None if this process can start a child in a private user and network
  namespace, else why not (what the relay's probe reported)."""
  try:
    probe = subprocess.run(_relay_command("--probe"), capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
  except (OSError, subprocess.SubprocessError) as e:
    return str(e)
  if probe.returncode == 0 and probe.stdout.strip() == "ready":
    return None
  return (probe.stdout.strip() or probe.stderr.strip()
          or f"exit status {probe.returncode}")


class WorkerBinary:
  """TFF's worker_binary in its namespace behind the relay, and the Unix socket
  to it. `max_concurrent_calls`: TFF's `max_concurrent_computation_calls` (<= 0: no limit)."""

  def __init__(self, max_concurrent_calls: int = -1):
    import tensorflow_federated

    # Where TFF's own factory looks for it.
    binary = os.path.join(os.path.dirname(tensorflow_federated.__file__), "data", "worker_binary")
    if not os.path.isfile(binary):
      raise RuntimeError(f"TFF's worker_binary is not at {binary}: the {TFF_CPP} backend needs it")
    self._dir = tempfile.mkdtemp(prefix="tff-cpp-")  # mode 0700: this user's alone
    self.path = os.path.join(self._dir, "worker.sock")
    self.pid: Optional[int] = None  # the worker_binary's, once it runs
    self._relay = subprocess.Popen(
        _relay_command(self.path, binary, str(max_concurrent_calls)),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    self._started: list[tuple[int, int]] = []  # the worker_binary's identity, once it runs
    # Not at interpreter exit: the relay ends by itself when this process does.
    self._finalizer = weakref.finalize(self, _stop, self._relay, self._dir, self._started,
                                       STOP_TIMEOUT_S)
    self._finalizer.atexit = False
    try:
      ready, _, _ = select.select([self._relay.stdout], [], [], START_TIMEOUT_S)
      line = self._relay.stdout.readline().decode(errors="replace").strip() if ready else ""
      if not line.startswith("ready "):
        raise RuntimeError(f"TFF's worker_binary did not start in its network namespace: "
                           f"{line or 'no answer in %.0f s' % START_TIMEOUT_S}")
      self.pid = int(line.split()[1])
      self._started.extend(filter(None, [process_table.identity(self.pid)]))
    except BaseException:
      self.close()
      raise

  @property
  def relay_pid(self) -> int:
    """The relay's pid; it leads the process group of itself and the worker_binary."""
    return self._relay.pid

  def close(self) -> None:
    """Stops the relay and the worker_binary (idempotent)."""
    self._finalizer()


def _stop(relay: subprocess.Popen, directory: str, worker_binaries: list[tuple[int, int]],
          timeout_s: float) -> None:
  """SIGTERM to the relay's process group (relay and worker_binary), SIGKILL
  after `timeout_s`; then waits for `worker_binaries` (`process_table.identity`s)."""
  for pipe in (relay.stdin, relay.stdout):
    with contextlib.suppress(OSError):
      pipe.close()
  for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, None)):
    with contextlib.suppress(OSError):  # the group is gone
      os.killpg(relay.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
      relay.wait(timeout=wait_s)
      break
  # The worker_binary's parent death signal ends it with the relay (a zombie counts as ended).
  deadline = time.monotonic() + timeout_s
  for worker in worker_binaries:
    while process_table.identity(worker[0]) == worker:
      if time.monotonic() > deadline:
        with contextlib.suppress(OSError):
          os.kill(worker[0], signal.SIGKILL)
        break
      time.sleep(0.02)
  shutil.rmtree(directory, ignore_errors=True)


def _close_channel(channel, timeout_s: float = 1.0) -> None:
  """`channel.close()`, once the channel's connectivity poller has stopped.

  TFF's executor stub subscribes to the channel's connectivity, so gRPC polls
  it from a thread, which prints "Cannot invoke RPC: Channel closed!" if the
  channel closes between two polls. So the subscriptions go first (gRPC's
  private `_unsubscribe_all`) and the poller is waited for (at most `timeout_s`).
  """
  state = getattr(channel, "_connectivity_state", None)
  unsubscribe_all = getattr(channel, "_unsubscribe_all", None)
  if state is not None and hasattr(state, "polling") and unsubscribe_all is not None:
    unsubscribe_all()
    deadline = time.monotonic() + timeout_s
    while state.polling and time.monotonic() < deadline:
      time.sleep(0.01)
  channel.close()


def execution_context(worker: WorkerBinary):
  """A TFF sync execution context whose executors run on `worker`, and its gRPC channel."""
  import grpc
  from tensorflow_federated.python.core.backends.native import compiler
  from tensorflow_federated.python.core.environments.tensorflow_frontend import (
      tensorflow_computation)
  from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
  from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
  from tensorflow_federated.python.core.impl.executors import remote_executor
  from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub
  from tensorflow_federated.python.core.impl.types import placements

  channel = grpc.insecure_channel("unix:" + worker.path, _GRPC_OPTIONS)
  grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
  stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)

  def stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = _DEFAULT_NUM_CLIENTS
    executor = remote_executor.RemoteExecutor(stub, stream_structs=False)
    executor.set_cardinalities(cardinalities)
    return executor

  factory = python_executor_stacks.ResourceManagingExecutorFactory(executor_stack_fn=stack_fn)
  return sync_execution_context.SyncExecutionContext(
      executor_fn=factory, compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result), channel


class Runtime(context_base.SyncContext):
  """TFF's C++ runtime as a TFF sync context, to install around calls.
  `max_concurrent_calls`: TFF's `max_concurrent_computation_calls` (None: no limit).

  Raises:
    ConfigError: naming `runtime.backend` if the worker_binary cannot be confined.
  """

  def __init__(self, max_concurrent_calls: Optional[int] = None):
    problem = namespace_problem()
    if problem is not None:
      from tff_fedadamom.config import ConfigError

      raise ConfigError(
          "<config>", "runtime.backend",
          f"the {TFF_CPP} backend runs TFF's worker_binary, which listens on every network "
          "interface and has no option to choose one, so it is run only inside a private "
          f"network namespace, and this process cannot create one ({problem})",
          value=TFF_CPP, allowed=f"{INPROCESS!r} or {RAY!r} (or a kernel that allows "
          "unprivileged user namespaces: user.max_user_namespaces > 0)")
    self._max_calls = max_concurrent_calls or -1
    self._lock = threading.Lock()
    self._worker_binary: Optional[WorkerBinary] = None
    self._context = self._channel = None
    self._closed = False

  @property
  def worker_binary(self) -> Optional[WorkerBinary]:
    """The running worker_binary, None before the first invocation and after `close()`."""
    return self._worker_binary

  def _started(self):
    with self._lock:
      if self._closed:
        raise RuntimeError(f"this {TFF_CPP} Runtime is closed")
      if self._context is None:
        self._worker_binary = WorkerBinary(self._max_calls)
        self._context, self._channel = execution_context(self._worker_binary)
      return self._context

  def invoke(self, comp, arg):
    return self._started().invoke(comp, arg)

  def close(self) -> None:
    """Ends the worker_binary (idempotent); no invocation is taken afterwards."""
    with self._lock:
      self._closed = True
      worker, channel = self._worker_binary, self._channel
      self._worker_binary = self._context = self._channel = None
    if channel is not None:
      _close_channel(channel)
    if worker is not None:
      worker.close()


class _InContext:
  """A computation of the wrapped process, called under the wrapper's runtime;
  its other attributes are the computation's."""

  def __init__(self, owner: "TffCppProcess", computation):
    self._owner, self._computation = owner, computation

  def __call__(self, *args, **kwargs):
    return self._owner.call(self._computation, *args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._computation, name)


def _in_runtime(name: str) -> property:
  """The wrapped process's computation `name`, called under the wrapper's runtime."""
  return property(lambda self: _InContext(self, getattr(self._process, name)),
                  doc=f"The process's `{name}`, run on this wrapper's runtime.")


class TffCppProcess:
  """The `tff_cpp` backend (`base.Backend`): a TFF learning process every
  callable attribute of which is called with this wrapper's `Runtime`
  (`max_concurrent_calls=max_concurrent_clients`) installed.

  Raises:
    ConfigError: naming `runtime.backend` if the worker_binary cannot be confined.
  """

  # The calls of `base.Backend`; any other attribute is reached through `__getattr__`.
  initialize = _in_runtime("initialize")
  get_model_weights = _in_runtime("get_model_weights")
  get_hparams = _in_runtime("get_hparams")
  set_hparams = _in_runtime("set_hparams")

  def __init__(self, process, client_tensors=None,
               max_concurrent_clients: Optional[int] = None):
    self.runtime = Runtime(max_concurrent_clients)
    self._process = process
    self._client_tensors = client_tensors

  def call(self, computation, *args, **kwargs):
    """`computation(*args, **kwargs)` with this wrapper's runtime installed."""
    from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

    with context_stack_impl.context_stack.install(self.runtime):
      return computation(*args, **kwargs)

  def next_for_clients(self, state, client_ids: Sequence, round_num: int):
    """One round of TFF's `next` over the datasets of `client_ids` in round `round_num`."""
    if self._client_tensors is None:
      raise TypeError("next_for_clients needs client_tensors=...; call next(state, datasets)")
    return self.call(self._process.next, state,
                     self._client_tensors.datasets(client_ids, round_num))

  def __getattr__(self, name):
    if name.startswith("_"):  # not the process's: e.g. before __init__ has set _process
      raise AttributeError(name)
    value = getattr(self._process, name)
    return _InContext(self, value) if callable(value) else value

  def close(self) -> None:
    """Ends the worker_binary (idempotent); the wrapper takes no calls afterwards."""
    self.runtime.close()

