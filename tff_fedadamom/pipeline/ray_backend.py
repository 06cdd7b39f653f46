"""Runs one experiment's clients on Ray actors (`runtime.backend: ray`).

TFF's MapReduceForm is the shape a cluster needs (see `inprocess` for how the
form is compiled and its parts run):

    broadcast   = prepare(state)                           driver
    out_c       = work(d_c, broadcast)                      actor k, for its clients c
    acc         = accumulate(...accumulate(zero, out_1)..., out_n)
                                                            actor 0, then 1, ...: each
                                                            continues the previous one's
    state', out = update(state, report(acc))               driver

Each actor is started once per run. It rebuilds `work`, `zero` and
`accumulate` from their serialized protos (no user Python is re-run), loads
the experiment's data through the data registry itself, and per round
receives only the broadcast (put into Ray's object store once) and the ids of
its clients; it builds their datasets exactly as the driver would
(`process.client_datasets`: shuffles are a function of (seed, round, client)).
All actors run their clients' `work` at once; then the accumulator goes from
actor to actor in actor order (as an object reference: through Ray's object
store, not through the driver), each folding its clients onto it in client
order. Server-side parts, `initialize`, `get_model_weights` and the hparams
run on the driver, in-process.

Why one fold across the actors rather than a fold per actor combined with the
form's `merge`: float32 addition is not associative, so merged partial sums,
(u1 + u2) + (u3 + u4), differ from the in-process backend's
((u1 + u2) + u3) + u4 by rounding, and an adaptive server optimizer amplifies
that: on the quickstart config (FedAdamom, epsilon 1e-3) a merge tree over 2
actors ended 3 rounds 6% (relative, a bias vector) away from the in-process
run. Folding in client order gives exactly the in-process sums; passing the
accumulator on costs one model-sized transfer per actor, and accumulation is
cheap next to `work`. The result equals the in-process backend's when both use
the same TensorFlow threads per client (their count changes how kernels split
reductions; `runtime.threads`, default: each actor's whole CPUs).

Assignment: the round's sampled clients (a function of (seed, round)) are cut
into `workers` contiguous blocks by position (`assign_clients`), so a run is a
function of its config and a resumed run assigns exactly as an uninterrupted
one.

Failure: an actor that dies during a round (`RayActorError`) is replaced by a
new one, which re-runs that actor's clients of this round; `work` is a
function of (dataset, broadcast) alone, so the round's result is the same as
without the failure. Actors are stopped by `close()`; a local Ray started here
is shut down then, and Ray ends its own processes when the driver dies (a
test kills a driver whose actors are inside `work`). Once, on a loaded machine,
an actor in the middle of a long ResNet `work` was seen to go on for minutes
as an orphan after its driver was killed, so each actor also watches its
parent (the raylet of its node) and ends its own process as soon as it is gone
(`Session(exit_with_parent=True)`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_fedadamom.config.schema import RAY_CPUS_PER_WORKER, RAY_GPUS_PER_WORKER, RAY_WORKERS
from tff_fedadamom.pipeline import inprocess, ray_session
from tff_fedadamom.pipeline.plan import threads_for_cpus
from tff_fedadamom.session import Session
from tff_fedadamom.pipeline.tf_computation import deserialize

# Replacements of one actor within one round before the round fails.
MAX_REPLACEMENTS = 3

# The parts of the form each actor runs.
WORKER_PARTS = ("work", "zero", "accumulate")


def assign_clients(client_ids: Sequence[Any], workers: int) -> list[list]:
  """The clients of each actor: `workers` contiguous blocks of `client_ids`, in
  order, whose sizes differ by at most one (the first ones are the larger).

  A function of the round's client list and `workers` alone; the list itself
  is a function of (seed, round) (`data.sampling.sample_clients`).
  """
  if workers < 1:
    raise ValueError(f"workers must be an integer >= 1, found {workers!r}")
  base, extra = divmod(len(client_ids), workers)
  blocks, start = [], 0
  for k in range(workers):
    size = base + (1 if k < extra else 0)
    blocks.append(list(client_ids[start:start + size]))
    start += size
  return blocks


class ClientWorker:
  """One actor's state: the experiment's data and the form's client parts.

  Args:
    experiment: The validated experiment config (`load_config`); pickled to the
      actor, it keeps its validated mark, so the actor does not validate it again.
    parts: `serialize`d bytes of the form's `work`, `zero` and `accumulate`.
    threads: TensorFlow's intra-op threads in this actor.
    max_concurrent_clients: Clients run at once in this actor (see `ClientFold`).
  """

  def __init__(self, experiment, parts: Mapping[str, bytes], threads: int,
               max_concurrent_clients: Optional[int] = None):
    from tff_fedadamom.pipeline import process as process_lib
    # The actor is its process's entry point; it ends with its raylet.
    Session(threads=threads, exit_with_parent=True).apply()
    self._client_tensors = process_lib.make_client_tensors(
        experiment, process_lib.load_data(experiment))
    self._outputs: list = []
    # Ray exposes to an actor only the GPUs it was given.
    self._fold = inprocess.ClientFold(*(deserialize(parts[name]) for name in WORKER_PARTS),
                                      inprocess.visible_devices(), max_concurrent_clients,
                                      feed=inprocess.client_feed(self._client_tensors))

  def work(self, client_ids: Sequence[Any], round_num: int,
           broadcast: Sequence[np.ndarray]) -> int:
    """Runs `work` for `client_ids` in round `round_num`; keeps the outputs for `fold`."""
    client_args = [self._client_tensors.args(cid, round_num) for cid in client_ids]
    self._outputs = self._fold.work_outputs(client_args,
                                            [tf.convert_to_tensor(b) for b in broadcast])
    return len(self._outputs)

  def fold(self, accumulator: Optional[Sequence[np.ndarray]]) -> list:
    """`accumulator` (None: `zero`) with the last `work`'s outputs accumulated
    onto it in client order (numpy leaves)."""
    if accumulator is not None:
      accumulator = [tf.convert_to_tensor(a) for a in accumulator]
    return [t.numpy() for t in self._fold.fold(self._outputs, accumulator)]

  def pid(self) -> int:
    return os.getpid()

  def node(self) -> str:
    """The id of the Ray node this actor runs on."""
    import ray

    return ray.get_runtime_context().get_node_id()


class RayLearningProcess(inprocess.InProcessLearningProcess):
  """A learning process whose clients run on Ray actors; the rest in-process.

  Same calls as `InProcessLearningProcess`, except that a round is
  `next_for_clients(state, client_ids, round_num)`: datasets are built on the
  actors, from the data each loaded itself.

  Args:
    process: The TFF learning process (compiled to MapReduceForm here), or
      its `compiled.CompiledProcess`.
    experiment: The `ExperimentConfig` whose data the actors load (validated
      here unless it is already; the actors receive it validated).
    workers: Number of actors.
    cpus_per_worker, gpus_per_worker: Ray resources of each actor.
    address: None (a new local Ray on 127.0.0.1, no dashboard), 'auto' or
      host:port. An already connected Ray is used as it is and left running.
    threads: TensorFlow threads per actor (default: `plan.threads_for_cpus`
      of its CPUs).
    max_concurrent_clients: Clients run at once within each actor. Default:
      `threads_for_cpus(cpus_per_worker)` when it has no GPU, so that an
      actor uses the CPUs Ray gave it and no more (two concurrent clients, each
      on its own thread, would keep two cores busy); with a GPU, one.
    worker_class: The actors' class (`ClientWorker` or a subclass).
  """

  def __init__(self, process, experiment, *, workers: int = RAY_WORKERS,
               cpus_per_worker: float = RAY_CPUS_PER_WORKER,
               gpus_per_worker: float = RAY_GPUS_PER_WORKER, address: Optional[str] = None,
               threads: Optional[int] = None, max_concurrent_clients: Optional[int] = None,
               worker_class: type = ClientWorker):
    from tff_fedadamom.config import load_config

    if workers < 1:
      raise ValueError(f"workers must be an integer >= 1, found {workers!r}")
    self.workers = workers
    self._experiment = load_config(experiment)
    self._options = dict(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, max_restarts=0)
    whole_cpus = threads_for_cpus(cpus_per_worker)
    self._threads = threads or whole_cpus
    if max_concurrent_clients is None:
      max_concurrent_clients = 1 if gpus_per_worker else whole_cpus
    self._address = address
    self._worker_class = worker_class
    self._actors: list = []
    self._started_ray = False
    self.replacements = 0
    # Seconds of the last round: prepare + object-store put ("broadcast"), the
    # actors' work, the fold across the actors ("fold") + report and update on
    # the driver ("server"), together "merge".
    self.round_times: dict[str, float] = {}
    super().__init__(process, devices=None, max_concurrent_clients=max_concurrent_clients)

  def _client_fold(self, compiled, max_concurrent_clients):
    """No clients run here: the actors get the client parts' bytes."""
    import ray

    self.max_concurrent_clients = max_concurrent_clients
    self._parts = {name: compiled.parts[name] for name in WORKER_PARTS}
    self._started_ray = ray_session.connect(self._address)
    self._remote = ray.remote(self._worker_class).options(**self._options)
    self._actors = [self._start_actor() for _ in range(self.workers)]
    return None

  def _start_actor(self):
    return self._remote.remote(self._experiment, self._parts, self._threads,
                               self.max_concurrent_clients)

  @property
  def actors(self) -> list:
    """The current actor handles, in fold order."""
    return list(self._actors)

  @property
  def takes_client_ids(self) -> bool:
    return True

  def next(self, state, client_data):
    raise TypeError("the ray backend builds client datasets on its actors: call "
                    "next_for_clients(state, client_ids, round_num)")

  def next_for_clients(self, state, client_ids: Sequence[Any], round_num: int):
    """One round over `client_ids`: broadcast, every actor's `work`, one fold
    across the actors in actor order, `report`, `update`."""
    import ray

    t0 = time.perf_counter()
    state_leaves = inprocess.flatten_value(state, self.state_type)
    broadcast = ray.put([t.numpy() for t in self._prepare.call_flat_leaves(state_leaves)])
    t1 = time.perf_counter()
    blocks = assign_clients(list(client_ids), self.workers)
    active = [k for k, block in enumerate(blocks) if block]

    def work(k):
      return self._actors[k].work.remote(blocks[k], round_num, broadcast)

    pending = {k: work(k) for k in active}
    for k in active:
      self._get(k, pending[k], work, round_num)
    t2 = time.perf_counter()
    accumulator = self._fold_across(active, work, round_num)
    t3 = time.perf_counter()
    output = self._finish(state_leaves, [tf.convert_to_tensor(a) for a in accumulator])
    t4 = time.perf_counter()
    self.round_times = {"broadcast_s": t1 - t0, "actors_s": t2 - t1, "merge_s": t4 - t2,
                        "fold_s": t3 - t2, "server_s": t4 - t3}
    return output

  def _fold_across(self, active: Sequence[int], work, round_num: int) -> list:
    """The accumulator folded across the `active` actors in actor order.

    Each actor's fold takes the previous one's result as an object reference,
    so the accumulator goes from actor to actor through Ray's object store and
    reaches the driver once. If an actor died meanwhile, the fold is redone
    actor by actor, replacing the dead one (its clients' `work` re-runs first;
    the others keep their outputs, and a fold is a function of them and the
    accumulator it is given).
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
    raise RuntimeError(f"ray worker {k} died {MAX_REPLACEMENTS + 1} times in round {round_num}")

  def close(self) -> None:
    """Stops the actors, and the local Ray if this process started it."""
    import ray

    if ray.is_initialized():
      for actor in self._actors:
        ray.kill(actor)
    self._actors = []
    if self._started_ray:
      ray.shutdown()
      self._started_ray = False
