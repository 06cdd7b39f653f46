"""The driver's side of the trial workers (`tuning.workers`): the pool actor that
hands trials their workers, a sweep's own pool, and a pool shared by sweeps.

A sweep's pool (`worker_pool`) is started and ended by `run_sweep`. A shared
pool (`shared_worker_pool`) is started by a caller that owns its Ray session
and passed to each of its sweeps: its workers, with their imports, data and
built processes, outlive every sweep but the pool's block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import uuid
from typing import Any, Callable, Mapping, Optional, Sequence

import ray
from ray import cloudpickle

from tuning.hosts import WorkerHost, WorkerLost, WorkerRef
from tuning.workers import NAMESPACE, PARTS_PER_WORKER

# Seconds `WorkerPool.shutdown` waits for its hosts to end their workers.
_TIDY_S = 10.0
# Calls a host serves at once, per CPU of its node, and beyond: a running trial
# holds one (its next event) and briefly a second (a release, the next trial's
# claim), and trials of half a CPU run two to a CPU; a worker's start holds one.
HOST_CALLS_PER_CPU = 4
HOST_CALLS_BEYOND = 16


def start_host(node: Mapping[str, Any]):
  """A new `hosts.WorkerHost` actor on `node` (a live node as `ray.nodes()`
  describes it); its template starts importing, unless it is this driver's node
  template (`tuning.template.current()`), already imported."""
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

  from tuning import template

  # No runtime environment of its own: Ray can start it in a worker it has
  # ready. Its workers set their own threads and GPUs (`hosts._worker_session`).
  cpus = node["Resources"].get("CPU", 0)
  return ray.remote(WorkerHost).options(
      num_cpus=0, max_concurrency=HOST_CALLS_BEYOND + int(HOST_CALLS_PER_CPU * cpus),
      scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
          template.current() if node["NodeID"] == _driver_node() else None)


class WorkerPool:
  """Hands out trial workers by (node, threads, GPU ids), forked by one
  `hosts.WorkerHost` per node; see the module doc."""

  def __init__(self, parts_per_worker: int = PARTS_PER_WORKER,
               warm: Sequence[Callable[[], dict]] = (),
               hosts: Optional[Mapping[str, Any]] = None):
    self._parts_per_worker = parts_per_worker
    self._warm: list[Callable[[], dict]] = list(warm)  # see `configure`
    self._hosts: dict[str, Any] = dict(hosts or {})  # node id -> its WorkerHost (`start_host`)
    self._workers: dict[tuple, list[WorkerRef]] = {}

  def _host(self, node_id: str):
    """The `WorkerHost` of node `node_id`, started on first use."""
    if node_id not in self._hosts:
      # A node gone since its trial started: the host's start fails on it.
      node = next((n for n in _alive_nodes() if n["NodeID"] == node_id),
                  {"NodeID": node_id, "Resources": {}})
      self._hosts[node_id] = start_host(node)
    return self._hosts[node_id]

  def _start(self, key: tuple) -> WorkerRef:
    node_id, threads, gpu_ids = key
    worker = WorkerRef(self._host(node_id), uuid.uuid4().hex)
    # Not waited for: the worker's first call waits for its start in the host.
    worker.host.start_worker.remote(worker.wid, threads, list(gpu_ids), self._parts_per_worker,
                                    cloudpickle.dumps(self._warm) if self._warm else b"")
    self._workers.setdefault(key, []).append(worker)
    return worker

  def _drop(self, worker: WorkerRef, host_lost: bool) -> None:
    """Forgets `worker`, and with `host_lost` its host and every worker of it."""
    for workers in self._workers.values():
      workers[:] = [w for w in workers
                    if w.wid != worker.wid and not (host_lost and w.host == worker.host)]
    if host_lost:
      self._hosts = {n: h for n, h in self._hosts.items() if h != worker.host}

  def configure(self, parts_per_worker: int, warm: Sequence[Callable[[], dict]]) -> None:
    """What the workers keep and warm up for the sweep about to run (a shared
    pool serves one sweep after another): workers started from now on take
    these; running ones keep at least `parts_per_worker` parts and warm up the
    structures of `warm` they have not built."""
    self._parts_per_worker = parts_per_worker
    self._warm = list(warm)
    pickled = cloudpickle.dumps(self._warm)  # loaded in each worker's trial thread
    for worker in self.workers():
      worker.call("add_warm", parts_per_worker, pickled)

  def prestart(self, node_id: str, threads: int, count: int) -> None:
    """Starts CPU workers on `node_id` ahead of the first trials, until it has
    `count` of `threads` threads (a shared pool's workers of earlier sweeps count)."""
    key = (node_id, threads, ())
    for _ in range(count - len(self._workers.get(key, []))):
      self._start(key)

  def acquire(self, node_id: str, threads: int, gpu_ids: Sequence[str], token: str,
              owner: tuple[int, int]):
    """A worker claimed for trial `token`, on node `node_id`."""
    key = (node_id, threads, tuple(gpu_ids))
    workers = self._workers.setdefault(key, [])
    for worker in list(workers):
      try:
        if ray.get(worker.call("claim", token, owner)):
          return worker
      except (ray.exceptions.RayActorError, WorkerLost) as lost:
        self._drop(worker, host_lost=isinstance(lost, ray.exceptions.RayActorError))
    worker = self._start(key)
    if not ray.get(worker.call("claim", token, owner)):
      raise RuntimeError("a new trial worker refused its first trial")
    return worker

  def workers(self) -> list:
    return [w for ws in self._workers.values() for w in ws]

  def shutdown(self) -> None:
    """Ends the hosts, each after its workers (`WorkerHost.shutdown`, at most
    `_TIDY_S` waited for)."""
    hosts = list(self._hosts.values())
    if hosts:
      ray.wait([h.shutdown.remote() for h in hosts], num_returns=len(hosts), timeout=_TIDY_S)
    for host in hosts:
      ray.kill(host)
    self._hosts.clear()
    self._workers.clear()


def _driver_node() -> Optional[str]:
  """This driver's node id (None for a Ray client: it runs on no node)."""
  with contextlib.suppress(Exception):
    return ray.get_runtime_context().get_node_id()
  return None


def _alive_nodes() -> list[dict]:
  """The cluster's live nodes, as `ray.nodes()` describes them."""
  return [n for n in ray.nodes() if n.get("Alive")]


def _prestart_count(resources, nodes: list[dict]) -> int:
  """How many trials of `resources` fit on this node at once, when this node is
  the whole cluster (`nodes`: its live nodes) and trials need no GPU (else 0:
  where and with which GPUs trials will run is known only when they start)."""
  if len(nodes) != 1 or resources.gpus_per_trial:
    return 0
  fits = int(nodes[0]["Resources"].get("CPU", 0) // resources.cpus_per_trial)
  return max(1, min(fits, resources.max_concurrent_trials or fits))


def spare_cpus(cluster_cpus: float, resources) -> float:
  """CPUs of a cluster of `cluster_cpus` beyond those a sweep's concurrent trials
  hold (`max_concurrent_trials` x `cpus_per_trial`); none when the number of
  concurrent trials is not capped (Tune then fills every CPU)."""
  if not resources.max_concurrent_trials:
    return 0.0
  return max(0.0, cluster_cpus - resources.max_concurrent_trials * resources.cpus_per_trial)


@dataclasses.dataclass(frozen=True)
class SharedWorkerPool:
  """A trial-worker pool that outlives sweeps (`shared_worker_pool`); pass it to
  `run_sweep(..., pool=...)`. `name` is its actor's name in `NAMESPACE`."""
  name: str


@contextlib.contextmanager
def _new_pool(prefix: str, *args, hosts: Optional[Mapping[str, Any]] = None):
  """A `WorkerPool(*args, hosts=hosts)` actor named `prefix`-<random> in
  `NAMESPACE`, yielded as a `SharedWorkerPool`; on exit it ends, and the hosts
  and workers it holds with it."""
  name = f"{prefix}-{uuid.uuid4().hex[:12]}"
  pool = ray.remote(WorkerPool).options(name=name, namespace=NAMESPACE,
                                        num_cpus=0).remote(*args, hosts=hosts)
  try:
    yield SharedWorkerPool(name)
  finally:
    with contextlib.suppress(Exception):
      ray.get(pool.shutdown.remote(), timeout=30)
    ray.kill(pool)
    for host in (hosts or {}).values():  # ended by the pool's shutdown, unless it failed
      ray.kill(host)


@contextlib.contextmanager
def shared_worker_pool():
  """Yields a `SharedWorkerPool` for the sweeps run inside the block, in the
  Ray session this process has already started or joined (its workers live
  there); on exit the pool and its workers end, the session itself stays up.

      with sweep_session(None), shared_worker_pool() as pool:
        run_sweep("a.yaml", pool=pool)
        run_sweep("b.yaml", pool=pool)   # its trials start in a's workers

  Raises:
    RuntimeError: this process is not connected to Ray.
  """
  if not ray.is_initialized():
    raise RuntimeError(
        "shared_worker_pool() needs this process connected to Ray (tuning.sweep_session(), "
        "ray_session() or ray.init()) before it starts: its "
        "workers live in that session, and only sweeps run in it can use them.")
  # On a one-node cluster every trial runs on this node: its host starts now,
  # beside the pool (as a sweep's own pool has it, `worker_pool`), so that the
  # first sweep's workers are forked from a template already importing.
  nodes = _alive_nodes()
  hosts = {nodes[0]["NodeID"]: start_host(nodes[0])} if len(nodes) == 1 else {}
  with _new_pool("trial-pool-shared", hosts=hosts) as pool:
    yield pool


def check_shared(pool: SharedWorkerPool, reuse_workers: bool = True) -> None:
  """Raises ValueError unless `pool` (`run_sweep`'s `pool` argument) is a
  `SharedWorkerPool` alive in this process's Ray session, and workers are reused."""
  if not reuse_workers:
    raise ValueError("run_sweep: `pool` holds long-lived trial workers; it cannot be "
                     "combined with reuse_workers=False.")
  if not isinstance(pool, SharedWorkerPool):
    raise ValueError(f"run_sweep: `pool` must be a tuning.pools.SharedWorkerPool "
                     f"(from shared_worker_pool()), found {type(pool).__name__}.")
  if ray.is_initialized():
    with contextlib.suppress(ValueError):
      ray.get_actor(pool.name, namespace=NAMESPACE)
      return
  raise ValueError(f"run_sweep: `pool` {pool.name!r} is not running in this process's Ray "
                   "session: a shared pool serves the sweeps run inside its "
                   "`with shared_worker_pool()` block, in the session it was made in.")


@contextlib.contextmanager
def worker_pool(sweep, enabled: bool = True, shared: Optional[SharedWorkerPool] = None):
  """Starts a `WorkerPool` for `sweep`, or readies `shared` for it; yields the
  pool's name (None when disabled).

  Must run inside a Ray session. On a one-node cluster it starts the workers
  the first trials will use right away (those a shared pool lacks), so that
  their imports overlap Tune's own start. Where the cluster has CPUs beyond
  those the concurrent trials hold (`spare_cpus`), idle workers also warm up
  each optimizer's structure ahead of its trials. On exit a pool of the
  sweep's own ends, with its workers; a shared one stays.
  """
  if not enabled:
    yield None
    return

  from tff_fedadamom.experiment.plan import threads_for_cpus
  from tuning import space as space_lib

  threads = threads_for_cpus(sweep.resources.cpus_per_trial)  # as `trial_threads` has it
  # Workers reserve no CPU, so a warm-up runs on the CPUs the running trials
  # hold unless the cluster has some to spare. On 2 cores with 2 trials of 1
  # CPU, the warm quickstart sweep took 13.9 s without warm-ups against 15.9 s
  # with them (a trial besides its rounds: 0.25 s against 0.62 s, median).
  nodes = _alive_nodes()
  cluster_cpus = float(sum(n["Resources"].get("CPU", 0) for n in nodes))
  spare = spare_cpus(cluster_cpus, sweep.resources) >= sweep.resources.cpus_per_trial
  warm = [functools.partial(space_lib.experiment_dict, sweep, optimizer, {},
                            output_dir=os.path.join("warm-up", optimizer), threads=threads)
          for optimizer in sweep.optimizers] if spare else []
  parts_per_worker = max(PARTS_PER_WORKER, len(sweep.optimizers))
  count = _prestart_count(sweep.resources, nodes)
  node_id = ray.get_runtime_context().get_node_id()
  with contextlib.ExitStack() as own:
    if shared is None:
      # The sweep's own pool: a shared one whose block is the sweep, configured
      # as it is made. Its calls wait for its process to start, not this one:
      # Tune starts meanwhile (run_sweep reached Tune 0.65-0.71 s after its
      # call when it waited, on 2 cores with Ray up and a warm process cache).
      # The host the first trials need is started here, beside the pool, not
      # by it: on 2 cores a first worker was ready 2.40-2.43 s after the pool's
      # start, against 2.49-2.51 s when the pool started the host itself.
      hosts = {node_id: start_host(nodes[0])} if count else {}  # count: one node, this one
      shared = own.enter_context(_new_pool("trial-pool", parts_per_worker, warm, hosts=hosts))
      pool = ray.get_actor(shared.name, namespace=NAMESPACE)
    else:  # configured before the sweep's first trial can ask it for a worker
      pool = ray.get_actor(shared.name, namespace=NAMESPACE)
      ray.get(pool.configure.remote(parts_per_worker, warm))
    if count:
      pool.prestart.remote(node_id, threads, count)
    yield shared.name
