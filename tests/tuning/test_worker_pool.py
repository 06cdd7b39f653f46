"""The trial-worker pool's actors without a sweep: what a worker sees of its
trial's GPUs and threads, and a shared pool's need for a Ray session. Each test
starts its own Ray, or needs none running (so not beside tests/tuning/test_workers'
module-wide Ray)."""

import os

import pytest

from tff_fedadamom.pipeline.ray_session import ray_session
from tuning.pools import WorkerPool, shared_worker_pool, spare_cpus
from tuning.workers import NAMESPACE, process_identity


def test_a_shared_pool_needs_a_ray_session_first():
  import ray

  assert not ray.is_initialized()
  with pytest.raises(RuntimeError, match=r"needs this process connected to Ray"):
    with shared_worker_pool():
      pass


def test_workers_warm_up_only_on_cpus_the_concurrent_trials_do_not_hold():
  """A warm-up runs beside the trials: only CPUs beyond those the concurrent
  trials hold are spare, and none when Tune may fill every CPU."""
  from tuning.schema import Resources

  two_of_one = Resources(cpus_per_trial=1, max_concurrent_trials=2)
  assert spare_cpus(2, two_of_one) == 0          # this machine: no warm-ups
  assert spare_cpus(8, two_of_one) == 6
  assert spare_cpus(8, Resources(cpus_per_trial=2, max_concurrent_trials=3)) == 2
  assert spare_cpus(1, two_of_one) == 0          # oversubscribed: nothing spare
  assert spare_cpus(64, Resources(cpus_per_trial=1, max_concurrent_trials=None)) == 0


def _in_actor(actor, fn, *args):
  """`fn(*args)` run in `actor`'s process (Ray's `__ray_call__` passes the
  actor's instance first)."""
  import ray

  return ray.get(actor.__ray_call__.remote(lambda _, *a: fn(*a), *args))


def test_a_worker_sees_the_gpus_of_its_trial_and_ray_leaves_them_alone(monkeypatch):
  """Ray blanks CUDA_VISIBLE_DEVICES of a zero-GPU actor unless told not to; a
  worker (zero GPUs of its own) must keep the GPU ids of the trial it serves.
  Ray is told of one GPU here; no GPU is needed (nothing runs on it)."""
  import ray

  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # tests/conftest.py hides GPUs

  # Started as every local Ray of the project is (`ray_session.connect`: on
  # loopback, tried again if its first start fails).
  with ray_session(None, resources={"num_cpus": 1, "num_gpus": 1}):
    pool = ray.remote(WorkerPool).options(namespace=NAMESPACE, num_cpus=0).remote()
    node = ray.get_runtime_context().get_node_id()
    owner = process_identity(os.getpid())
    gpu = ray.get(pool.acquire.remote(node, 1, ["0"], "a", owner))
    cpu = ray.get(pool.acquire.remote(node, 2, [], "b", owner))
    getenv = lambda name: os.environ.get(name)  # looked up in the actor
    assert _in_actor(gpu, getenv, "CUDA_VISIBLE_DEVICES") == "0"
    assert _in_actor(cpu, getenv, "CUDA_VISIBLE_DEVICES") == ""
    assert _in_actor(cpu, getenv, "TF_NUM_INTEROP_THREADS") == "2"
    assert _in_actor(cpu, getenv, "TF_NUM_INTRAOP_THREADS") == "1"
    # A busy worker is not handed out again: another trial of its key gets a new one.
    again = ray.get(pool.acquire.remote(node, 1, ["0"], "c", owner))
    assert _in_actor(again, os.getpid) != _in_actor(gpu, os.getpid)

    def convert_a_function():  # in the worker: AutoGraph writes a file for `bump`
      import tensorflow as tf

      from tff_fedadamom.session import autograph_files

      @tf.function
      def bump(x):
        if x > 0:
          x += 1
        return x

      bump(tf.constant(1))
      return autograph_files()

    # The pool ends its workers with ray.kill, which skips their exit handlers
    # (AutoGraph's among them): each first removes the files AutoGraph wrote for it.
    written = _in_actor(cpu, convert_a_function)
    assert written and all(os.path.exists(path) for path in written)
    ray.get(pool.shutdown.remote())
    assert not any(os.path.exists(path) for path in written)
