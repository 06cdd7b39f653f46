"""A sweep on an existing two-node Ray cluster (both nodes on loopback, 1 CPU
each): with `resources.address` set, trials run on both nodes.

The cluster is two Ray nodes of their own, each started by a process of its own
that exits once the node runs, as `ray start` does, under a temporary temp dir;
the driver (the test) joins it by address, as on a real cluster. Every TCP
listener of the cluster's processes must be on loopback, when it has started
and again after the test.

Why not the `ray start` CLI (Ray 2.52): Ray binds its GCS, raylets and core
workers to 127.0.0.1 only when the node's address is exactly 127.0.0.1, and to
every interface otherwise; but `ray start` replaces an address of 127.0.0.1
(`--node-ip-address`, `--address`) by the machine's outward address
(`services.resolve_ip_for_localhost`), so its nodes listen on every interface
and its agents and Ray client server on that address. Only with
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 does Ray keep 127.0.0.1, and under it the
CLI refuses to start a worker node. The nodes are therefore started with the
Python API the CLI itself ends in, `ray._private.node.Node`, given 127.0.0.1
(`ray.cluster_utils.Cluster` uses it too, but would start the nodes inside the
test's process and write, then delete, the machine-wide /tmp/ray address file
that other Ray users' `ray.init()` reads). The driver's `ray.init` makes the
same replacement of the address it joins (`_keep_loopback`). No Ray client
server is started: the tests join by host:port.

The cluster is stopped by ending exactly its processes (those started with its
marker in their environment or naming its temp dir, and their descendants):
`ray stop` would end every Ray process on the machine, other users' included.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from tests.tuning.conftest import tiny_base, write_sweep
from tests import process_table as processes
from tuning import run_sweep

CLUSTER_ENV = "TUNING_TEST_RAY_CLUSTER"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _cluster_pids(temp_dir: str) -> list[int]:
  """The cluster's processes: those started with CLUSTER_ENV=temp_dir in their
  environment (everything the node starters launched, orphans included) or naming
  `temp_dir` on their command line, and all their descendants."""
  mark = f"{CLUSTER_ENV}={temp_dir}".encode()
  # Zombies have already ended, they are only not reaped.
  table = [p for p in processes.stats() if p.running and p.pid != os.getpid()]
  roots = [p.pid for p in table
           if mark in (processes.environ(p.pid) or ())
           or temp_dir.encode() in (processes.cmdline(p.pid) or b"")]
  return sorted(set(roots) | set(processes.descendants(roots, table)))


def _stop_cluster(temp_dir: str) -> None:
  """SIGKILL, at once: the nodes are the test's own and hold nothing to save.
  (Their GCS server and raylets outlast a SIGTERM by more than 5 s, which a
  SIGTERM's grace period cost every test of a cluster.) Killed again until none
  is left: a raylet may have started a worker in between."""
  deadline = time.monotonic() + 10.0
  while (pids := _cluster_pids(temp_dir)) and time.monotonic() < deadline:
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    time.sleep(0.1)


def _assert_on_loopback(temp_dir: str) -> None:
  """Every TCP listener of the cluster's processes is on loopback (and there
  are some: the GCS and the raylets listen)."""
  pids = _cluster_pids(temp_dir)
  assert processes.tcp_listeners(pids), "the cluster's services listen on TCP"
  off = [(pid, (processes.cmdline(pid) or b"")[:120], table, address)
         for pid in pids for table, address in processes.tcp_listeners([pid])
         if address not in processes.LOOPBACK]
  assert not off, off


# Starts one node from RayParams' fields (argv[2]) and exits, leaving the
# node's processes running: what `ray start` does once it has resolved its
# arguments, without replacing 127.0.0.1.
_START_NODE = textwrap.dedent("""
    import json, sys
    from ray._private.node import Node
    from ray._private.parameter import RayParams
    Node(RayParams(**json.loads(sys.argv[2])), head=sys.argv[1] == "head",
         shutdown_at_exit=False, spawn_reaper=False)
""")

def _start_node(role: str, env: dict, **params) -> None:
  subprocess.run([sys.executable, "-c", _START_NODE, role, json.dumps(params)], check=True,
                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)


def _keep_loopback(monkeypatch) -> None:
  """This process, the driver, joins 127.0.0.1:<port> as given: `ray.init`
  would otherwise connect to the machine's outward address, where nothing of
  the cluster listens. What RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 does; Ray reads
  the variable when it is imported, so the value read is patched, for the test
  at hand only."""
  from ray._private import ray_constants

  monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)


@pytest.fixture
def two_node_cluster(monkeypatch):
  _keep_loopback(monkeypatch)
  temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths
  port = _free_port()
  env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **{CLUSTER_ENV: temp_dir})
  common = dict(node_ip_address="127.0.0.1", num_cpus=1, dashboard_agent_listen_port=0)
  try:
    _start_node("head", env, gcs_server_port=port, temp_dir=temp_dir, include_dashboard=False,
                **common)
    _start_node("worker", env, gcs_address=f"127.0.0.1:{port}", **common)
    _assert_on_loopback(temp_dir)
    yield f"127.0.0.1:{port}"
    _assert_on_loopback(temp_dir)  # again, with the workers and actors of the test
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
