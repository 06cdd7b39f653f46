"""Runs one experiment's clients on Ray actors (`runtime.backend: ray`).

The middle line of a MapReduceForm round (`server`) runs on the actors:

    out_c       = work(d_c, broadcast)                      actor k, for its clients c
    acc         = accumulate(...accumulate(zero, out_1)..., out_n)
                                                            actor 0, then 1, ...: each
                                                            continues the previous one's

Each actor is started once per run: it rebuilds its computations from their
serialized protos, loads the experiment's data itself, and per round receives
only the broadcast (put into Ray's object store once) and its clients' ids.
All actors run their clients' `work` at once; then the accumulator goes from
actor to actor through the object store, each folding its clients onto it in
client order (`inprocess.ClientFold`).

Why one fold across the actors, not a fold per actor combined with the form's
`merge`: float32 addition is not associative, so (u1 + u2) + (u3 + u4) differs
from the in-process ((u1 + u2) + u3) + u4 by rounding, which an adaptive server
optimizer amplifies. Folding in client order gives the in-process sums exactly,
for one model-sized transfer per actor, when both use the same TensorFlow
threads per client (`runtime.threads`, default: each actor's whole CPUs).

Failure: an actor that dies during a round (`RayActorError`) is replaced, and
the new one re-runs that actor's clients of the round; `work` is a function of
(dataset, broadcast), so the result is the same. Each actor also ends itself
when its node's raylet is gone (`Session(exit_with_parent=True)`).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_fedadamom.config.schema import RAY_CPUS_PER_WORKER, RAY_GPUS_PER_WORKER, RAY_WORKERS
from tff_fedadamom.runtime import ray_session
from tff_fedadamom.runtime import inprocess
from tff_fedadamom.runtime.inprocess import CLIENT_COMPUTATIONS
from tff_fedadamom.runtime.ray_actor import ClientActor
from tff_fedadamom.runtime.server import ServerCalls, ServerComputations
from tff_fedadamom.experiment.plan import threads_for_cpus

# Replacements of one actor within one round before the round fails.
MAX_REPLACEMENTS = 3


def ray_actors(runtime_config) -> dict:
  """The ray backend's settings (`RayLearningProcess`'s keyword arguments) from
  the config's `runtime` fields, nulls resolved."""
  cpus = runtime_config.cpus_per_worker or RAY_CPUS_PER_WORKER
  return dict(actors=runtime_config.workers or RAY_WORKERS, cpus_per_actor=cpus,
              gpus_per_actor=runtime_config.gpus_per_worker or RAY_GPUS_PER_WORKER,
              address=runtime_config.address, threads=runtime_config.threads,
              max_concurrent_clients=runtime_config.max_concurrent_clients)


def actor_labels(settings: Mapping[str, Any]) -> list[str]:
  """What summary.json names as the devices of ray rounds, given the backend's
  settings (`ray_actors`): 'ray actor K (CPU|GPU)'."""
  kind = "GPU" if settings["gpus_per_actor"] else "CPU"
  return [f"ray actor {k} ({kind})" for k in range(settings["actors"])]


def assign_clients(client_ids: Sequence[Any], actors: int) -> list[list]:
  """The clients of each actor: `actors` contiguous blocks of `client_ids`, in
  order, whose sizes differ by at most one (the first ones are the larger), so
  a resumed run assigns as an uninterrupted one."""
  if actors < 1:
    raise ValueError(f"actors must be an integer >= 1, found {actors!r}")
  base, extra = divmod(len(client_ids), actors)
  bounds = [k * base + min(k, extra) for k in range(actors + 1)]
  return [list(client_ids[start:stop]) for start, stop in zip(bounds, bounds[1:])]


class RayLearningProcess(ServerCalls):
  """The `ray` backend (`base.Backend`): a learning process whose clients run on
  Ray actors, the rest in-process, on this process's first device.

  Args:
    process: The TFF learning process, or its `compiled.CompiledProcess`.
    experiment: The `ExperimentConfig` whose data the actors load.
    actors, cpus_per_actor, gpus_per_actor: The actors, and each one's Ray resources.
    address: As `ray_session.connect`'s.
    threads: TensorFlow threads per actor (default: `plan.threads_for_cpus`).
    max_concurrent_clients: Clients run at once within each actor. Default:
      with a GPU, one; else `ClientFold`'s, on the actor's `threads` (so an
      actor keeps busy the CPUs Ray gave it and no more).
    actor_class: `ClientActor` or a subclass.
  """

  def __init__(self, process, experiment, *, actors: int = RAY_WORKERS,
               cpus_per_actor: float = RAY_CPUS_PER_WORKER,
               gpus_per_actor: float = RAY_GPUS_PER_WORKER, address: Optional[str] = None,
               threads: Optional[int] = None, max_concurrent_clients: Optional[int] = None,
               actor_class: type = ClientActor):
    import ray

    from tff_fedadamom.config import load_config
    from tff_fedadamom.runtime.compiled import compile_process

    if actors < 1:
      raise ValueError(f"actors must be an integer >= 1, found {actors!r}")
    self.num_actors = actors
    self._experiment = load_config(experiment)
    self._threads = threads or threads_for_cpus(cpus_per_actor)
    self.max_concurrent_clients = (max_concurrent_clients if max_concurrent_clients is not None
                                   else 1 if gpus_per_actor else None)
    compiled = compile_process(process)
    self.server = ServerComputations(compiled, inprocess.visible_devices()[0])
    self._computations = {name: compiled.computations[name] for name in CLIENT_COMPUTATIONS}
    self.replacements = 0
    self._started_ray = ray_session.connect(address)
    self._remote = ray.remote(actor_class).options(
        num_cpus=cpus_per_actor, num_gpus=gpus_per_actor, max_restarts=0)
    self._actors = [self._start_actor() for _ in range(actors)]

  def _start_actor(self):
    return self._remote.remote(self._experiment, self._computations, self._threads,
                               self.max_concurrent_clients)

  @property
  def actors(self) -> list:
    """The current actor handles, in fold order."""
    return list(self._actors)

  def next_for_clients(self, state, client_ids: Sequence[Any], round_num: int):
    import ray

    def fold(broadcast):
      ref = ray.put([t.numpy() for t in broadcast])  # into the object store once
      return self._fold_on_actors(list(client_ids), [round_num] * len(client_ids),
                                  [0] * len(client_ids), [ref], round_num)

    return self.server.round(state, fold)

  def fold_tasks(self, tasks: Sequence[tuple], broadcasts: Sequence[Sequence[Any]],
                 which: Sequence[int], scales: Sequence[float], update: slice) -> list:
    """`inprocess.InProcessLearningProcess.fold_tasks` on the actors."""
    import ray

    refs = [ray.put([np.asarray(b) for b in broadcast]) for broadcast in broadcasts]
    return self._fold_on_actors([cid for cid, _ in tasks], [r for _, r in tasks], list(which),
                                refs, tasks[0][1], scales=list(scales), update=update)

  def _fold_on_actors(self, client_ids: list, rounds: list, which: list, refs: list,
                      round_num: int, **scaling) -> list:
    """The accumulator (flat tensors) of client i's data of `rounds[i]`, trained
    from the broadcast `refs[which[i]]`; `scaling` as `ClientActor.work`'s."""
    blocks = assign_clients(list(range(len(client_ids))), self.num_actors)
    active = [k for k, block in enumerate(blocks) if block]

    def work(k):
      block = blocks[k]
      used = sorted({which[i] for i in block})
      extra = {key: [value[i] for i in block] if isinstance(value, list) else value
               for key, value in scaling.items()}
      return self._actors[k].work.remote(
          [client_ids[i] for i in block], [rounds[i] for i in block],
          [used.index(which[i]) for i in block], *[refs[j] for j in used], **extra)

    pending = {k: work(k) for k in active}
    for k in active:
      self._get(k, pending[k], work, round_num)
    return [tf.convert_to_tensor(a) for a in self._fold_across(active, work, round_num)]

  def _fold_across(self, active: Sequence[int], work, round_num: int) -> list:
    """The accumulator folded across the `active` actors in actor order.

    Each actor's fold takes the previous one's result as an object reference,
    so the accumulator reaches the driver once. If an actor died meanwhile,
    the fold is redone actor by actor, the dead one replaced and its clients'
    `work` re-run first (the others keep their outputs).
    """
    import ray

    ref = None
    for k in active:
      ref = self._actors[k].fold.remote(ref)
    try:
      return ray.get(ref)
    except ray.exceptions.RayError:
      pass
    accumulator = None
    for k in active:

      def fold(k, accumulator=accumulator):
        return self._actors[k].fold.remote(accumulator)

      def redo(k, fold=fold):  # a new actor: its clients' work first (tasks run in order)
        work(k)
        return fold(k)

      accumulator = self._get(k, fold(k), redo, round_num)
    return accumulator

  def _get(self, k: int, ref, resubmit, round_num: int):
    """The value of actor k's task `ref`; a dead actor is replaced and
    `resubmit(k)` runs on the new one."""
    import ray

    for _ in range(MAX_REPLACEMENTS + 1):
      try:
        return ray.get(ref)
      except ray.exceptions.RayActorError:
        self.replacements += 1
        self._actors[k] = self._start_actor()
        ref = resubmit(k)
    raise RuntimeError(f"ray actor {k} died {MAX_REPLACEMENTS + 1} times in round {round_num}")

  def close(self) -> None:
    """Stops the actors, and the local Ray if this process started it."""
    import ray

    if ray.is_initialized():
      for actor in self._actors:
        ray.kill(actor)
    self._actors = []
    if self._started_ray:
      ray_session.disconnect()
      self._started_ray = False
