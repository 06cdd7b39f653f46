"""A run plan (`RunPlan`): what a validated config resolves to, worked out once per run.

Each derived value costs something (the devices ask TensorFlow; the state paths
build the server optimizer), and a value derived twice can be derived two ways.
So one function, `parts.make_plan`, derives them all once, and the runner, the
parts, the initial state and the backends read them from the plan.

This module sits below every other pipeline module (it imports only the config
schema), so that the backends (`runtime.base`, `runtime.ray`) can share its rules
without importing each other, and the process builder its loop choice:
`threads_for_cpus` and `training_loop` live here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

from tff_fedadamom.config.schema import ExperimentConfig


def threads_for_cpus(cpus: float) -> int:
  """The TensorFlow (inter-op) threads of a process given `cpus` CPUs: its whole
  CPUs, at least one (a fractional share still runs one thread).

  The one formula for every process sized by its CPU share: a sweep trial
  (`cpus_per_trial`, what Tune gives it) and a ray backend actor
  (`cpus_per_worker`).
  """
  return max(1, int(cpus))


def training_loop(devices: Sequence[str]):
  """TFF's loop over a client's data for rounds on `devices`: the iterator loop.

  TFF's other loop, `dataset.reduce`, instantiates (and optimizes with
  Grappler) its training step afresh on every call: on a small model that is
  most of a client's time. The
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


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """A validated config and what a run derives from it, each derived once.

  Attributes:
    config: The validated `ExperimentConfig`.
    backend: INPROCESS, TFF_CPP or RAY (`auto` resolved).
    devices: The devices the rounds run on (`backends.round_devices`).
    threads: TensorFlow threads this process must run with (the config's
      `runtime.threads`); None with the ray backend, where they size each actor
      (its own process), not this one.
    ray: The ray backend's settings, nulls resolved
      (`runtime.ray.ray_actors`: actors, CPUs and GPUs per actor, address,
      threads, concurrent clients), which its actors and device labels are
      made from; None with the other backends.
    key: The config's `parts.structure_key`.
    state_paths: `parts.state_hparams(config)`: config path -> (component,
      hparam) in `process.get_hparams(state)`.
    server_optimizer: The server optimizer `state_paths` was read from (None
      for registry entries that are whole learning processes), for the
      process built from this plan to use rather than build another.
  """

  config: ExperimentConfig
  backend: str
  devices: tuple
  threads: Optional[int]
  ray: Optional[Mapping[str, Any]]
  key: str
  state_paths: Mapping[str, tuple]
  server_optimizer: Any = dataclasses.field(default=None, compare=False, repr=False)

