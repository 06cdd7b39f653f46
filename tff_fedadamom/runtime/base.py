"""Where rounds run: the `Backend` protocol, and the one choice of a backend.

Three backends (`runtime.backend`, described in `schema.RuntimeConfig`), one
module each: `inprocess` (what `auto` means: no child process, no open port),
`tff_cpp` and `ray`. The runner, the loop and the hooks make only the calls of
`Backend`. `build_backend` is the one place that reads `plan.RunPlan.backend`.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, runtime_checkable

from tff_fedadamom.config.schema import RAY, TFF_CPP


@runtime_checkable
class Backend(Protocol):
  """What runs a learning process's computations: the calls a run makes, on
  the Python containers TFF's own context returns."""

  def initialize(self) -> Any:
    """The process's initial state."""

  def next_for_clients(self, state, client_ids: Sequence[Any], round_num: int) -> Any:
    """One round over `client_ids`, their datasets a function of (seed, round,
    client): TFF's `LearningProcessOutput`."""

  def get_model_weights(self, state) -> Any:
    """The global model's `ModelWeights` in `state`."""

  def get_hparams(self, state) -> Any:
    """The hparams `state` holds (server optimizer, client learning rate)."""

  def set_hparams(self, state, hparams) -> Any:
    """`state` with `hparams` put in."""

  def close(self) -> None:
    """Ends what the backend started (threads, a worker_binary, Ray actors); idempotent."""


def ray_settings(backend: str, runtime_config) -> Optional[dict]:
  """The ray backend's settings (`ray.ray_actors`), for `plan.RunPlan.ray`;
  None when `backend` (resolved) is another."""
  if backend != RAY:
    return None
  from tff_fedadamom.runtime.ray import ray_actors

  return ray_actors(runtime_config)


def round_devices(backend: str, runtime_config, ray: Optional[dict] = None,
                  source: str = "<config>") -> list[str]:
  """The devices the rounds of `backend` (resolved) run on, as summary.json
  names them: tff_cpp, the worker_binary's CPU; ray, one label per actor of
  `ray` (`ray_settings`); inprocess, TensorFlow's full names of `runtime.devices`.

  Raises:
    ConfigError: naming `runtime.devices` when TensorFlow does not see one of them.
  """
  if backend == TFF_CPP:
    from tff_fedadamom.runtime.tff_cpp import TFF_CPP_DEVICE

    return [TFF_CPP_DEVICE]
  if backend == RAY:
    from tff_fedadamom.runtime.ray import actor_labels

    if ray is None:
      raise ValueError("the ray backend's devices are its actors: pass its settings (ray=...)")
    return actor_labels(ray)
  from tff_fedadamom.config import ConfigError
  from tff_fedadamom.runtime import inprocess

  try:
    return inprocess.resolve_devices(runtime_config.devices)
  except ValueError as e:
    raise ConfigError(source, "runtime.devices", str(e),
                      value=list(runtime_config.devices or ()),
                      allowed=f"devices TensorFlow sees: {inprocess.visible_names()}") from None


def build_backend(plan, process, client_tensors=None) -> Backend:
  """The backend `plan` names (`plan.RunPlan.backend`), running `process`.

  `process`: TFF's process for `tff_cpp`, its `CompiledProcess` for the
  others. `client_tensors`: the run's `ClientTensors`, from which `inprocess`
  and `tff_cpp` build each round's client data (the ray actors load their own).
  """
  runtime_config = plan.config.runtime
  concurrent: Optional[int] = runtime_config.max_concurrent_clients
  if plan.backend == TFF_CPP:
    from tff_fedadamom.runtime import tff_cpp

    return tff_cpp.TffCppProcess(process, client_tensors, max_concurrent_clients=concurrent)
  if plan.backend == RAY:
    from tff_fedadamom.runtime import ray

    return ray.RayLearningProcess(process, plan.config, **plan.ray)
  from tff_fedadamom.runtime import inprocess

  return inprocess.InProcessLearningProcess(
      process, devices=list(plan.devices), max_concurrent_clients=concurrent,
      client_tensors=client_tensors)
