"""The trial-worker pool's actors without a sweep: what a worker forked from its
node's template sees of its trial's GPUs and threads, that the workers and the
template end with their host, and a shared pool's need for a Ray session. Each test
starts its own Ray, or needs none running (so not beside tests/tuning/test_workers'
module-wide Ray)."""

import contextlib
import os

import pytest

from tff_fedadamom.runtime.ray_session import ray_session
from tuning.pools import WorkerPool, shared_worker_pool, spare_cpus
from tuning.workers import NAMESPACE, process_identity


def test_a_shared_pool_needs_a_ray_session_first():
  import ray

  assert not ray.is_initialized()
  with pytest.raises(RuntimeError, match=r"needs this process connected to Ray"):
    with shared_worker_pool():
      pass


@pytest.mark.parametrize("nodes, started", [(["n1"], ["n1"]), (["n1", "n2"], [])])
def test_a_shared_pool_starts_the_host_of_a_one_node_cluster_with_it(monkeypatch, nodes,
                                                                      started):
  """On one node every trial runs there: its host, and so its template's imports,
  start with the pool, beside it (as a sweep's own pool has it); on a cluster,
  a node's host starts when a trial there first needs a worker."""
  import ray

  from tuning import pools

  made = []

  @contextlib.contextmanager
  def new_pool(prefix, *args, hosts=None):
    made.append(dict(hosts or {}))
    yield pools.SharedWorkerPool(prefix)

  monkeypatch.setattr(ray, "is_initialized", lambda: True)
  monkeypatch.setattr(pools, "_alive_nodes", lambda: [{"NodeID": n, "Alive": True,
                                                       "Resources": {"CPU": 2.0}}
                                                      for n in nodes])
  monkeypatch.setattr(pools, "start_host", lambda node: f"host of {node['NodeID']}")
  monkeypatch.setattr(pools, "_new_pool", new_pool)
  with shared_worker_pool():
    assert made == [{n: f"host of {n}" for n in started}]


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


@contextlib.contextmanager
def _ray_with_a_gpu(monkeypatch, cpus: int):
  """A local Ray told of `cpus` CPUs and one GPU (no GPU is needed unless
  something runs on it), started as every local Ray of the project is
  (`ray_session.connect`: on loopback, tried again if its first start fails).
  Yields `acquire(pool, threads, gpu_ids, token)`: a worker of `pool` for a
  trial of this process on this node."""
  import ray

  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # tests/conftest.py hides GPUs
  with ray_session(None, resources={"num_cpus": cpus, "num_gpus": 1}):
    node = ray.get_runtime_context().get_node_id()
    owner = process_identity(os.getpid())
    yield lambda pool, threads, gpu_ids, token: ray.get(
        pool.acquire.remote(node, threads, gpu_ids, token, owner))


def _new_pool():
  import ray

  return ray.remote(WorkerPool).options(namespace=NAMESPACE, num_cpus=0).remote()


def _in_worker(worker, fn, *args):
  """`fn(*args)` run in the process of `worker` (a `tuning.hosts.WorkerRef`)."""
  import ray

  return ray.get(worker.host.run.remote(worker.wid, fn, *args))


def test_a_worker_sees_the_gpus_and_threads_of_its_trial(monkeypatch):
  """Workers are forked from one template per node: each sets its trial's GPU
  ids and threads after the fork, before TensorFlow starts. Ray blanks
  CUDA_VISIBLE_DEVICES of a zero-GPU actor unless told not to, so a worker
  (zero GPUs of its own) sets the GPU ids of the trial it serves. Ray is told of
  one GPU here; no GPU is needed (nothing runs on it)."""
  import ray

  with _ray_with_a_gpu(monkeypatch, cpus=1) as acquire:
    pool = _new_pool()
    gpu = acquire(pool, 1, ["0"], "a")
    cpu = acquire(pool, 2, [], "b")
    getenv = lambda name: os.environ.get(name)  # looked up in the worker
    assert _in_worker(gpu, getenv, "CUDA_VISIBLE_DEVICES") == "0"
    assert _in_worker(cpu, getenv, "CUDA_VISIBLE_DEVICES") == ""
    assert _in_worker(cpu, getenv, "TF_NUM_INTEROP_THREADS") == "2"
    assert _in_worker(cpu, getenv, "TF_NUM_INTRAOP_THREADS") == "1"

    def tf_threads():
      import tensorflow as tf

      return (tf.config.threading.get_intra_op_parallelism_threads(),
              tf.config.threading.get_inter_op_parallelism_threads())

    assert _in_worker(cpu, tf_threads) == (1, 2) and _in_worker(gpu, tf_threads) == (1, 1)
    # A busy worker is not handed out again: another trial of its key gets a new one.
    again = acquire(pool, 1, ["0"], "c")
    assert _in_worker(again, os.getpid) != _in_worker(gpu, os.getpid)
    # All three were forked by one template, which imported TensorFlow for them.
    templates = {_in_worker(w, os.getppid) for w in (gpu, cpu, again)}
    assert len(templates) == 1
    template = templates.pop()
    with open(f"/proc/{template}/maps") as f:
      assert "_pywrap_tensorflow_internal" in f.read()

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

    # The pool ends its workers with SIGKILL, which skips their exit handlers
    # (AutoGraph's among them): each first removes the files AutoGraph wrote for it.
    written = _in_worker(cpu, convert_a_function)
    assert written and all(os.path.exists(path) for path in written)
    processes = [_in_worker(w, os.getpid) for w in (gpu, cpu, again)] + [template]
    sockets = _sockets_dir(gpu)
    assert os.path.isdir(sockets) and _in_worker(cpu, _sockets_dir_here) == sockets
    # ... where a worker's temporary files go too: a killed worker's go with its host.
    assert all(os.path.dirname(path) == sockets for path in written)
    ray.get(pool.shutdown.remote())
    assert not any(os.path.exists(path) for path in written)
    assert _all_end(processes) and not os.path.exists(sockets)

    # A host that dies (ray.kill, as when its node's Ray stops) takes its
    # workers and template with it, though the workers are not its children.
    pool = _new_pool()
    worker = acquire(pool, 1, [], "d")
    processes = [_in_worker(worker, os.getpid), _in_worker(worker, os.getppid)]
    sockets = _sockets_dir(worker)
    ray.kill(worker.host)
    # Its workers remove its sockets' directory, which its killed process could not.
    assert _all_end(processes) and not os.path.exists(sockets)
    ray.kill(pool)


def _sockets_dir_here() -> str:
  """This process's `multiprocessing` directory (a forked worker inherits its host's)."""
  from multiprocessing import util

  return util.get_temp_dir()


def _sockets_dir(worker) -> str:
  """The `multiprocessing` directory of `worker`'s host: its fork server's and
  its workers' managers' sockets."""
  import ray

  return ray.get(worker.host.__ray_call__.remote(lambda _: _sockets_dir_here()))


def _all_end(pids, within_s: float = 5.0) -> bool:
  """Whether every process of `pids` has ended (or is a zombie) within `within_s`."""
  import time

  from tff_fedadamom import process_table

  deadline = time.monotonic() + within_s
  while time.monotonic() < deadline:
    if not process_table.still_running(pids):
      return True
    time.sleep(0.1)
  return False


def _machine_gpus() -> int:
  """GPUs the machine has (`nvidia-smi -L`), whatever this process may see."""
  import shutil
  import subprocess

  if not shutil.which("nvidia-smi"):
    return 0
  listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
  return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


@pytest.mark.skipif(not _machine_gpus(), reason="this machine has no GPU")
def test_a_forked_worker_runs_on_the_gpu_of_its_trial(monkeypatch):
  """The template imports TensorFlow without touching CUDA, so a worker forked
  from it finds exactly its trial's GPU, and one without a GPU finds none."""
  import ray

  with _ray_with_a_gpu(monkeypatch, cpus=2) as acquire:
    pool = _new_pool()
    gpu = acquire(pool, 1, ["0"], "a")
    cpu = acquire(pool, 1, [], "b")

    def gpus_and_a_sum():
      import tensorflow as tf

      with tf.device("GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"):
        total = tf.reduce_sum(tf.ones([4]))
      return len(tf.config.list_physical_devices("GPU")), total.device, float(total)

    count, device, total = _in_worker(gpu, gpus_and_a_sum)
    assert count == 1 and "GPU:0" in device and total == 4.0
    assert _in_worker(cpu, gpus_and_a_sum)[0] == 0
    ray.get(pool.shutdown.remote())
