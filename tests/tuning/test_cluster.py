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

from tests.helpers import tiny_base
from tests.tuning.conftest import write_sweep
from tuning import run_sweep

# `two_node_cluster` is the suite's fixture (tests/conftest.py, tests/helpers.py).


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
