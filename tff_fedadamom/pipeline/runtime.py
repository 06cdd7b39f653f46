"""Where rounds run: the execution backend, TensorFlow's threads and devices.

Three backends (`runtime.backend`):

* `inprocess` (what `auto` means): TFF compiles the learning process to its
  MapReduceForm and its TensorFlow parts run in this Python process
  (`inprocess.InProcessLearningProcess`), on the GPUs TensorFlow sees, with no
  child process and no open port.
* `tff_cpp`: TFF's own C++ runtime, kept as the reference. It runs every
  TensorFlow computation in TFF's `worker_binary`, a child process built
  without CUDA. That binary listens on every network interface and cannot be
  told otherwise, so it runs in a private network namespace, reachable only
  through a Unix socket, and ends with this process (`tff_cpp`). Its execution
  context is installed around each call of the process (`tff_cpp.TffCppProcess`),
  never as TFF's default.
* `ray`: the clients of each round run on Ray actors (`ray_backend`), the
  server's parts in this process; a local Ray is bound to 127.0.0.1 and shut
  down with the run.

Nothing here installs a signal handler: the CLI does that for itself.
"""

from __future__ import annotations

from typing import Sequence

from tff_fedadamom.config.schema import (INPROCESS, RAY, RAY_CPUS_PER_WORKER,  # noqa: F401
                                         RAY_GPUS_PER_WORKER, RAY_WORKERS, TFF_CPP)
from tff_fedadamom.config.schema import resolved_backend as backend  # noqa: F401
# The client loop rounds use; its home is `plan`, below the process builder.
from tff_fedadamom.pipeline.plan import training_loop  # noqa: F401

# What summary.json names as the device of tff_cpp rounds.
TFF_CPP_DEVICE = "CPU (TFF worker_binary)"


def ray_workers(runtime_config) -> dict:
  """The ray backend's settings, nulls resolved: workers, CPUs and GPUs per
  worker, address, threads and concurrent clients per worker."""
  cpus = runtime_config.cpus_per_worker or RAY_CPUS_PER_WORKER
  return dict(workers=runtime_config.workers or RAY_WORKERS, cpus_per_worker=cpus,
              gpus_per_worker=runtime_config.gpus_per_worker or RAY_GPUS_PER_WORKER,
              address=runtime_config.address, threads=runtime_config.threads,
              max_concurrent_clients=runtime_config.max_concurrent_clients)


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


def executable(process, runtime_config, devices: Sequence[str], experiment=None,
               client_tensors=None):
  """The object whose `initialize`/`next`/`get_model_weights`/... the runner calls.

  `inprocess`: the process compiled to run here, on `devices`; `tff_cpp`: the
  process wrapped to run on TFF's C++ runtime (`tff_cpp.TffCppProcess`; with
  `client_tensors`, its rounds take client ids too); `ray`: the process compiled
  here, its clients on Ray actors that load `experiment`'s data (its rounds
  are `next_for_clients(state, client_ids, round_num)`).
  """
  if backend(runtime_config) == TFF_CPP:
    from tff_fedadamom.pipeline import tff_cpp

    return tff_cpp.TffCppProcess(process, client_tensors,
                                 max_concurrent_clients=runtime_config.max_concurrent_clients)
  if backend(runtime_config) == RAY:
    from tff_fedadamom.pipeline import ray_backend

    if experiment is None:
      raise ValueError("the ray backend needs the experiment config (experiment=...)")
    return ray_backend.RayLearningProcess(process, experiment, **ray_workers(runtime_config))
  from tff_fedadamom.pipeline import inprocess

  return inprocess.InProcessLearningProcess(
      process, devices=devices, max_concurrent_clients=runtime_config.max_concurrent_clients,
      client_tensors=client_tensors)
