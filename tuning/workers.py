"""Long-lived trial workers: a sweep pays imports, data and process builds once per
worker, not once per trial.

A trial of a small model spends most of its wall time before its first round:
importing TensorFlow and TFF, loading and partitioning the data, building the
learning process and starting TFF's runtime. Everything a sweep varies between
trials of one structure lives in the process state (see
`tff_fedadamom.experiment.parts`), so a worker that keeps those parts runs the
next trial from `process.initialize()` plus `set_hparams`, with the results a
fresh process gives.

Why not Tune's `reuse_actors` alone: a Tuner ends its actors when `fit`
returns, and an Optuna sweep runs a Tuner per optimizer. And a reused function
trainable runs each trial in a new thread, where TFF's execution context (a
thread-local) is not installed. Tune does reuse the trainables' processes,
which with a pool only report.

The pieces:
  * `pools.WorkerPool`, one actor per `run_sweep`, created and owned by the
    driver (`pools.worker_pool`): it ends with the sweep, and the workers it
    started with it. It hands a trial a free worker of the trial's key,
    starting one when none is free. A caller that owns its Ray session and
    runs sweep after sweep (a notebook, a test module, a study) can instead
    keep one pool for all of them (`pools.shared_worker_pool`, passed as
    `run_sweep(..., pool=...)`): a later sweep's trials then start in workers
    that have imported TensorFlow and TFF, loaded the data and built the
    processes of the sweeps before it. A trial's results do not depend on what
    ran before it in its worker (tested), so nothing but the start-up changes.
  * `TrialWorker` holds a `PartsCache`. One thread of its own runs every
    trial (TFF's context stack is thread-local); the threads that serve its
    calls only pass events. In a sweep each worker is a process forked from a
    per-node template that has imported TensorFlow and TFF
    (`tuning.hosts.WorkerHost`), which relays the calls; on its own (tests,
    benchmarks) the object imports them in its thread.
  * The Tune trainable stays the trial: it holds the trial's resources,
    restores its checkpoint, and reports every evaluation the worker hands
    back (`run_trial`). The worker waits at each evaluation until the trainable
    asks for the next event, so no file of the run changes while Tune copies
    its checkpoint.

Resources. Workers reserve nothing (their host is a `num_cpus=0` actor): the
trial's trainable holds the trial's CPUs and GPU share while its worker
computes, and a worker serves one trial at a time. A worker's key is (node,
CPUs per trial, the GPU ids Ray gave the trial). Its thread pools are sized to
the trial's CPUs before TensorFlow starts, and it sees exactly the trial's GPUs
(`worker_env`, set right after the fork): a trial's rounds run on the GPU Ray
assigned to the trial. Trials that share a GPU fraction of the same GPU share
workers of that key.

Failures. A worker that dies fails the one trial it runs: its trainable gets
`hosts.WorkerLost` (`RayActorError` if the whole host died), and Tune restarts
the trial from its last checkpoint in another worker. A trainable that ends (an
ASHA stop, a crash) is noticed by its worker, which checks at every round and
while it waits at an evaluation that the trial's process still runs (on the
same node), and gives the trial up.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import traceback
import uuid
from typing import Any, Callable, Collection, Optional, Sequence

import ray
from ray import cloudpickle

# (pid, start time) of a running process: a trial's owner, told apart from a reused pid.
from tff_fedadamom.process_table import identity as process_identity

NAMESPACE = "tff_fedadamom"
# Built experiments each worker keeps at least; a sweep's pool keeps one per
# optimizer (a joint sweep interleaves them), which it warms up ahead of their
# trials where the cluster has CPUs to spare (`pools.spare_cpus`).
PARTS_PER_WORKER = 2
# How often a waiting worker checks that its trial's process still runs.
_POLL_S = 0.2
# How long a claim waits for a given-up trial to unwind before starting a worker.
_CLAIM_WAIT_S = 10.0


def worker_env(threads: int, gpu_ids: Sequence[str]) -> dict[str, str]:
  """The environment that sizes a trial's TensorFlow (and TFF's worker_binary)
  to its CPUs and shows it its GPUs, set before TensorFlow is imported."""
  return {
      # Kernels single-threaded, clients side by side (see tff_fedadamom.session).
      "TF_NUM_INTRAOP_THREADS": "1",
      "TF_NUM_INTEROP_THREADS": str(threads),
      "OMP_NUM_THREADS": "1",
      "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids),
  }


class _Abandoned(Exception):
  """The trial's process has ended or released the trial."""


class _Trial:
  """One trial in a worker: its events, and whether its owner still wants it."""

  def __init__(self, token: str, owner: tuple[int, int]):
    self.token, self.owner = token, owner
    self.events: queue.Queue = queue.Queue()
    self.delivered = 0
    self.ack = threading.Semaphore(0)
    self.released = threading.Event()
    self.finished = threading.Event()

  def given_up(self) -> bool:
    return self.released.is_set() or process_identity(self.owner[0]) != self.owner

  def check(self, *_) -> None:
    if self.given_up():
      raise _Abandoned()

  def give_up(self) -> None:
    """Marks the trial released, and wakes its run if it waits at an evaluation.

    Why wake it: Tune ends a trial at its last report, and its trainable
    releases it without asking for another event. The run waited out its poll
    (`_POLL_S`) before it noticed, and the next trial's claim of this worker
    waited with it: 0.13-0.16 s a trial, on the quickstart sweep."""
    self.released.set()
    self.ack.release()

  def hand_over(self, event) -> None:
    """Passes `event` to the trainable; returns once it asks for the next one."""
    self.events.put(("eval", event))
    while not self.ack.acquire(timeout=_POLL_S):
      self.check()
    self.check()  # woken by `give_up`, not by the trainable


class TrialWorker:
  """Runs trials one at a time, keeping their parts (see the module doc).

  Args:
    parts_per_worker: The size of its `PartsCache`.
    warm: Callables returning experiment dicts (one per optimizer of the
      sweep, in the order the sweep runs them): while no trial waits, the
      worker builds their parts and runs `parts.warm_up`, so that a trial
      whose structure is among them starts with its process built and
      compiled. Best effort: a warm-up that fails is skipped.
  """

  def __init__(self, parts_per_worker: int = PARTS_PER_WORKER,
               warm: Sequence[Callable[[], dict]] = ()):
    self._parts_per_worker = parts_per_worker
    self._warm = list(warm)
    self._jobs: queue.Queue = queue.Queue()
    self._lock = threading.Lock()
    self._current: Optional[_Trial] = None
    self._trials: dict[str, _Trial] = {}
    self._cache = None
    threading.Thread(target=self._loop, name="tff-trials", daemon=True).start()

  def claim(self, token: str, owner: tuple[int, int], wait_s: float = _CLAIM_WAIT_S) -> bool:
    """Takes the worker for trial `token` if it is free, or once the trial it
    runs has been given up and has unwound (waiting at most `wait_s`)."""
    with self._lock:
      current = self._current
    if current is not None and not current.finished.is_set():
      if not current.given_up():
        return False
      current.give_up()
      if not current.finished.wait(wait_s):
        return False
    with self._lock:
      if self._current is not current:
        return False
      for stale in [t for t, trial in self._trials.items() if trial.finished.is_set()]:
        del self._trials[stale]
      self._current = self._trials[token] = _Trial(token, owner)
      return True

  def start(self, token: str, callables: bytes, scratch: str) -> None:
    """Queues trial `token`: `callables` is `(make_experiment, make_result,
    checkpoint_rounds)` pickled (`cloudpickle`), loaded in the trial thread
    (`_loop`).

    Why pickled: Ray unpickles a method's arguments in one of its own threads,
    and these import the project's modules when unpickled. In a new worker
    that ran beside the trial thread's start-up imports of the same modules,
    and Python handed one thread a partially initialized module (seen once:
    "cannot import name 'apply_overrides' from partially initialized module
    'tff_fedadamom.config.loader'", a restarted trial lost)."""
    self._jobs.put((self._trials[token], callables, scratch))

  def next_event(self, token: str):
    """The trial's next event: ('eval', make_result(EvalEvent)), ('done', None),
    ('error', traceback text) or ('abandoned', None)."""
    trial = self._trials[token]
    if trial.delivered:
      trial.ack.release()
    while True:
      try:
        kind, payload = trial.events.get(timeout=_POLL_S)
        break
      except queue.Empty:
        if trial.given_up():
          return "abandoned", None
    trial.delivered += 1
    return kind, payload

  def release(self, token: str) -> None:
    """The trainable is done with trial `token` (finished or stopped)."""
    trial = self._trials.get(token)
    if trial is not None:
      trial.give_up()

  def add_warm(self, parts_per_worker: int, warm: bytes) -> None:
    """Another sweep of a shared pool: keep at least `parts_per_worker` parts,
    and warm up those of `warm`'s structures this worker has not built
    (`warm`: the callables pickled, loaded in the trial thread as in `start`)."""
    self._parts_per_worker = max(self._parts_per_worker, parts_per_worker)
    if self._cache is not None:
      self._cache.max_size = max(self._cache.max_size, parts_per_worker)
    self._jobs.put(warm)  # also wakes the loop if it waits for a trial

  def _loop(self) -> None:
    from tff_fedadamom.session import startup_imports

    try:
      with startup_imports():  # the worker is its process's entry point
        import tff_fedadamom.experiment.runner  # noqa: F401 - TensorFlow, TFF, what trials run
    except ImportError:  # a trial imports it again, and its error goes to its trainable
      pass
    while True:
      try:
        job = self._jobs.get(block=not self._warm)
      except queue.Empty:
        self._warm_up(self._warm.pop(0))
        continue
      if isinstance(job, bytes):  # add_warm's callables; best effort, as warm-ups are
        try:
          self._warm.extend(cloudpickle.loads(job))
        except Exception:  # noqa: BLE001 - the trials build what warming could not
          traceback.print_exc()
        continue
      trial, callables, scratch = job
      try:
        self._run(trial, *cloudpickle.loads(callables))
      except BaseException:  # noqa: BLE001 - the error goes to the trainable
        if trial.given_up():
          shutil.rmtree(scratch, ignore_errors=True)
        else:
          trial.events.put(("error", traceback.format_exc()))
      finally:
        trial.finished.set()

  @staticmethod
  def _plan(make_experiment):
    """The run plan of an experiment, made once for the cache and the run alike."""
    from tff_fedadamom.config import load_config
    from tff_fedadamom.experiment.parts import make_plan
    from tff_fedadamom.session import Session

    config = load_config(make_experiment())
    # The worker is its process's entry point; its trials share one thread count.
    Session(threads=config.runtime.threads).apply()
    return make_plan(config)

  def _parts(self, plan):
    """The parts of `plan`, through this worker's cache."""
    from tff_fedadamom.experiment.parts_cache import PartsCache

    if self._cache is None:
      self._cache = PartsCache(self._parts_per_worker)
    return self._cache.get(plan)

  def _warm_up(self, make_experiment) -> None:
    from tff_fedadamom.experiment.parts import warm_up

    try:
      plan = self._plan(make_experiment)
      if self._cache is not None and plan.key in self._cache:
        return  # built and compiled for an earlier sweep
      warm_up(plan, self._parts(plan))
    except Exception:  # noqa: BLE001 - the trial builds what warming could not
      traceback.print_exc()

  def _run(self, trial: _Trial, make_experiment, make_result, checkpoint_rounds) -> None:
    from tff_fedadamom.experiment import run_experiment

    trial.check()
    plan = self._plan(make_experiment)
    parts = self._parts(plan)
    # The run directory is scratch (`trainable.train_trial`): no model or plot.
    run_experiment(plan, parts=parts, progress=False, on_round=trial.check,
                   on_eval=lambda event: trial.hand_over(make_result(event)),
                   model_and_plot=False, checkpoint_rounds=checkpoint_rounds)
    trial.events.put(("done", None))


def run_trial(pool_name: str, make_experiment: Callable[[], dict],
              make_result: Callable[[Any], Any], report: Callable[[Any], None], *,
              threads: int, gpu_ids: Sequence[str], scratch: str,
              checkpoint_rounds: Optional[Collection[int]] = None) -> None:
  """Runs one trial in a pooled worker: `report(make_result(event))` for every
  evaluation, in the calling (trainable's) process. The run saves its state at
  `checkpoint_rounds` (`run_experiment`'s), or every `checkpoint_every` rounds.

  `make_experiment()` (the trial's experiment dict) and `make_result(event)`
  run in the worker, where TensorFlow is already imported: the trainable
  itself never imports it.
  """
  pool = ray.get_actor(pool_name, namespace=NAMESPACE)
  token = uuid.uuid4().hex
  owner = process_identity(os.getpid())
  node_id = ray.get_runtime_context().get_node_id()
  worker = ray.get(pool.acquire.remote(node_id, threads, list(gpu_ids), token, owner))
  try:
    callables = cloudpickle.dumps((make_experiment, make_result, checkpoint_rounds))
    ray.get(worker.call("start", token, callables, scratch))
    while True:
      kind, payload = ray.get(worker.call("next_event", token))
      if kind == "eval":
        report(payload)
      elif kind == "done":
        return
      else:
        raise RuntimeError(f"the trial failed in its worker:\n{payload}")
  finally:
    worker.call("release", token)
