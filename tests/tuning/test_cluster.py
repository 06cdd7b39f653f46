"""A sweep on an existing two-node Ray cluster (both nodes on loopback, 1 CPU
each): with `resources.address` set, trials run on both nodes.

The cluster is started with the `ray start` CLI, as on a real cluster, under a
temporary `--temp-dir` of its own. It is stopped by ending exactly the processes
of that cluster (those naming its temp dir, and their descendants): `ray stop`
would end every Ray process on the machine, other users' included.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from tests.tuning.conftest import tiny_base, write_sweep
from tests import process_table as processes
from tuning import run_sweep

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
CLUSTER_ENV = "TUNING_TEST_RAY_CLUSTER"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _cluster_pids(temp_dir: str) -> list[int]:
  """The cluster's processes: those started with CLUSTER_ENV=temp_dir in their
  environment (everything `ray start` launched, orphans included) or naming
  `temp_dir` on their command line, and all their descendants."""
  mark = f"{CLUSTER_ENV}={temp_dir}".encode()
  # Zombies have already ended, they are only not reaped.
  table = [p for p in processes.stats() if p.running and p.pid != os.getpid()]
  roots = [p.pid for p in table
           if mark in (processes.environ(p.pid) or ())
           or temp_dir.encode() in (processes.cmdline(p.pid) or b"")]
  return sorted(set(roots) | set(processes.descendants(roots, table)))


def _stop_cluster(temp_dir: str) -> None:
  for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
    pids = _cluster_pids(temp_dir)
    for pid in pids:
      try:
        os.kill(pid, sig)
      except OSError:
        pass
    deadline = time.monotonic() + wait
    while _cluster_pids(temp_dir) and time.monotonic() < deadline:
      time.sleep(0.2)


def _ray_start(*args, env):
  subprocess.run([RAY, "start", *args], check=True, env=env, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, timeout=120)


@pytest.fixture
def two_node_cluster():
  temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths
  port = _free_port()
  env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **{CLUSTER_ENV: temp_dir})
  common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
            "--dashboard-agent-listen-port=0", "--disable-usage-stats"]
  try:
    _ray_start("--head", f"--port={port}", "--include-dashboard=false",
               f"--ray-client-server-port={_free_port()}", *common, env=env)
    _ray_start(f"--address=127.0.0.1:{port}", *common, env=env)
    yield f"127.0.0.1:{port}"
  finally:
    _stop_cluster(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)
    assert not _cluster_pids(temp_dir)


def test_sweep_on_a_two_node_cluster(tmp_path, two_node_cluster, no_leftover_workers):
  import ray

  path = write_sweep(tmp_path, {
      "name": "cluster",
      "base": tiny_base(),
      "optimizers": ["fedavg"],
      "budget": {"trials_per_optimizer": 2, "rounds": 2},
      "space": {"client.learning_rate": None},
      "search": {"kind": "random", "seed": 0},
      # 1 CPU per trial and 1 CPU per node: two concurrent trials need both nodes.
      "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 2,
                    "address": two_node_cluster,
                    "storage_path": str(tmp_path / "sweeps")},
  })
  result = run_sweep(path, progress_interval_s=60)
  assert not ray.is_initialized()  # disconnected; the cluster itself stays up
  grid = result.results["fedavg"]
  assert len(grid) == 2 and grid.num_terminated == 2 and not grid.errors
  where = {(r.metrics["node_id"], r.metrics["hostname"], r.metrics["pid"]) for r in grid}
  assert len({node for node, _, _ in where}) == 2, where
  assert set(result.export.best) == {"fedavg"}
