"""A run plan (`RunPlan`): what a validated config resolves to, worked out once per
run by `parts.make_plan` (each derived value costs something, and a value derived
twice can be derived two ways).

This module imports only the config schema, so that the backends and the
process builder can share its rules (`threads_for_cpus`, `training_loop`)
without importing each other.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

from tff_fedadamom.config.schema import ExperimentConfig


def threads_for_cpus(cpus: float) -> int:
  """The TensorFlow (inter-op) threads of a process given `cpus` CPUs (a sweep
  trial, a ray backend actor): its whole CPUs, at least one."""
  return max(1, int(cpus))


def training_loop(devices: Sequence[str]):
  """TFF's loop over a client's data for rounds on `devices`: the iterator loop.
  TFF's `dataset.reduce` instantiates (and optimizes) its training step afresh on
  every call, most of a client's time on a small model; the iterator loop is
  optimized once, with the client computation, and lets the training ops follow
  the model onto a GPU. Both give bit-identical weights on the CPU.
  """
  del devices  # the same loop everywhere
  import tensorflow_federated as tff

  return tff.learning.LoopImplementation.DATASET_ITERATOR


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """A validated config and what a run derives from it, each derived once."""

  config: ExperimentConfig
  backend: str  # INPROCESS, TFF_CPP or RAY (`auto` resolved)
  devices: tuple  # what the rounds run on (`backends.round_devices`)
  # TensorFlow threads this process runs with (`runtime.threads`); None with the
  # ray backend, where they size each actor.
  threads: Optional[int]
  ray: Optional[Mapping[str, Any]]  # `runtime.ray.ray_actors`; None off the ray backend
  key: str  # `parts.structure_key`
  state_paths: Mapping[str, tuple]  # `parts.state_hparams`
  # The server optimizer `state_paths` was read from (None for whole learning
  # processes), for the process built from the plan.
  server_optimizer: Any = dataclasses.field(default=None, compare=False, repr=False)
