"""What several test modules share: the repository's root and its modules, the
tiny experiment configs, readers of a run's outputs and of a state's leaves,
stand-ins for the round loop, the tff_cpp backend's process pair, and a
two-node loopback Ray cluster.

A test module imports these from here, never from another test module
(tests/test_test_imports.py checks it): importing a test module runs its
module-level code and hands its tests to whoever imports it. Heavy libraries
(TensorFlow, Ray) are imported inside the functions that need them, so
importing this module is cheap (a conftest imports it).
"""

import csv
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import types

import numpy as np

from tests import process_table as processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The packages whose modules the structure tests read.
PACKAGES = ("tff_fedadamom", "tuning")


def package_modules(packages=PACKAGES):
  """(module name, path) of every Python file of `packages`."""
  for package in packages:
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
      for name in sorted(files):
        if name.endswith(".py"):
          path = os.path.join(folder, name)
          module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
          yield module.removesuffix(".__init__"), path


# ------------------------------------------------------------------ configs


def _base_raw(output_dir, rounds, eval_every):
  """1,797 digits over 8 clients, logistic regression, FedAdamom: a round takes
  milliseconds and a learning process a few seconds to build."""
  return {
      "seed": 3, "rounds": rounds, "clients_per_round": 3, "eval_every": eval_every,
      "checkpoint_every": 1, "output_dir": str(output_dir), "targets": [0.3, 0.99],
      "data": {"name": "digits", "num_clients": 8,
               "partition": {"kind": "dirichlet", "alpha": 0.5}},
      "model": {"name": "logistic"},
      "client": {"learning_rate": 0.1, "batch_size": 16},
      "server": {"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.1},
  }


def tiny(output_dir, **overrides):
  """The tiny run as a raw mapping: 4 rounds, evaluated every 2nd. An override
  `section__field=value` sets one field of a section (None removes it), any
  other `key=value` replaces the key."""
  raw = _base_raw(output_dir, rounds=4, eval_every=2)
  for key, value in overrides.items():
    section, _, field = key.partition("__")
    if field:
      raw[section] = {**raw[section], field: value}
      if value is None:
        del raw[section][field]
    else:
      raw[key] = value
  return raw


def tiny_config(output_dir="unused", **sections):
  """The tiny run as a validated config: 3 rounds, each evaluated. A mapping
  merges into its section, except a `server` naming an optimizer, which
  replaces the base's (none of FedAdamom's hparams); any other value replaces
  the key."""
  from tff_fedadamom.config import load_config

  raw = _base_raw(output_dir, rounds=3, eval_every=1)
  for section, values in sections.items():
    if section == "server" and "optimizer" in values:
      raw[section] = values
    elif isinstance(values, dict):
      raw[section] = {**raw.get(section, {}), **values}
    else:
      raw[section] = values
  return load_config(raw)


def tiny_base(**overrides):
  """A sweep's base experiment: 1,797 digits over 10 clients, logistic
  regression, FedAvg; a trial takes seconds."""
  base = {
      "seed": 0, "eval_every": 1, "checkpoint_every": 1, "targets": [0.3, 0.9],
      "telemetry": False, "diverge_patience": 1, "clients_per_round": 4,
      "data": {"name": "digits", "num_clients": 10,
               "partition": {"kind": "dirichlet", "alpha": 0.5}},
      "model": {"name": "logistic"},
      "client": {"learning_rate": 0.1, "batch_size": 20},
      "server": {"optimizer": "fedavg"},
  }
  base.update(overrides)
  return base


# ------------------------------------------------------------------ a run's outputs


def saved_weights(output_dir):
  """The weights of the run's saved model (model.keras), as arrays."""
  import tensorflow as tf

  from tff_fedadamom.experiment import outputs

  model = tf.keras.models.load_model(os.path.join(str(output_dir), outputs.MODEL_FILE))
  return [w.numpy() for w in model.weights]


def metrics_rows(output_dir):
  """The run's metrics.csv rows as text, without the timing columns (`time/`),
  which differ between two runs of one config."""
  with open(os.path.join(str(output_dir), "metrics.csv")) as f:
    return [{k: v for k, v in row.items() if not k.startswith("time/")}
            for row in csv.DictReader(f)]


def state_leaves(value):
  """The leaves of a (nested) process state or result, in `tf.nest` order, as
  arrays: what two states are compared by, leaf for leaf."""
  import tensorflow as tf

  return [np.asarray(leaf) for leaf in tf.nest.flatten(value)]


# ------------------------------------------------------------------ the round loop's stand-ins


class CountingProcess:
  """A stand-in backend. State = one weight that each round adds 1 to; the
  n-th round run has training loss `losses.get(n, 1.0)`, the server rejects
  the update of `rejected` rounds, and from round `nan_from` on the weight is
  NaN. `calls` records each round's (state, clients, round_num)."""

  def __init__(self, losses=None, rejected=(), nan_from=None):
    self.losses = losses or {}
    self.rejected = set(rejected)
    self.nan_from = nan_from
    self.clients_seen = []
    self.calls = []
    self.weight_fetches = 0

  def next_for_clients(self, state, clients, round_num):
    self.calls.append((state, clients, round_num))
    self.clients_seen.append(clients)
    round_num = len(self.clients_seen)
    state = math.nan if self.nan_from and round_num >= self.nan_from else state + 1.0
    metrics = {"client_work": {"train": {"loss": self.losses.get(round_num, 1.0),
                                         "num_examples": 4}},
               "finalizer": {"update_non_finite": int(round_num in self.rejected)}}
    return types.SimpleNamespace(state=state, metrics=metrics)

  def get_model_weights(self, state):
    self.weight_fetches += 1
    return types.SimpleNamespace(trainable=[np.float32(state)])


def sampler(round_num):
  """Two clients a round, named after it."""
  return [f"c{round_num}", f"d{round_num}"]


def evaluator(process, state):
  """A `CountingProcess` state's test accuracy: a tenth of its weight."""
  from tff_fedadamom.metric_names import TEST_ACCURACY

  del process
  return {TEST_ACCURACY: state / 10}


# ------------------------------------------------------------------ the tff_cpp backend


def relay_and_worker(pids):
  """(relay pid, worker pid), the only processes among `pids`: the worker is the
  relay's child."""
  from tff_fedadamom.runtime import tff_cpp

  lines = {pid: (processes.cmdline(pid) or b"").split(b"\0") for pid in pids}
  relays = [pid for pid, args in lines.items() if args[2:3] == [tff_cpp.RELAY.encode()]]
  workers = [pid for pid, args in lines.items() if args[0].endswith(b"/worker_binary")]
  assert len(relays) == 1 and len(workers) == 1 and len(lines) == 2, lines
  assert processes.stat(workers[0]).ppid == relays[0], lines
  return relays[0], workers[0]


# ------------------------------------------------------------------ a two-node Ray cluster
#
# Two Ray nodes of their own (both on loopback, 1 CPU each), each started by a
# process of its own that exits once the node runs, as `ray start` does, under a
# temporary temp dir; the driver (the test) joins it by address, as on a real
# cluster. Every TCP listener of the cluster's processes must be on loopback,
# when it has started and again after the test.
#
# Why not the `ray start` CLI (Ray 2.52): Ray binds its GCS, raylets and core
# workers to 127.0.0.1 only when the node's address is exactly 127.0.0.1, and to
# every interface otherwise; but `ray start` replaces an address of 127.0.0.1
# (`--node-ip-address`, `--address`) by the machine's outward address
# (`services.resolve_ip_for_localhost`), so its nodes listen on every interface
# and its agents and Ray client server on that address. Only with
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 does Ray keep 127.0.0.1, and under it the
# CLI refuses to start a worker node. The nodes are therefore started with the
# Python API the CLI itself ends in, `ray._private.node.Node`, given 127.0.0.1
# (`ray.cluster_utils.Cluster` uses it too, but would start the nodes inside the
# test's process and write, then delete, the machine-wide /tmp/ray address file
# that other Ray users' `ray.init()` reads). The driver's `ray.init` makes the
# same replacement of the address it joins (`keep_loopback`). No Ray client
# server is started: the tests join by host:port.
#
# The cluster is stopped by ending exactly its processes (those started with its
# marker in their environment or naming its temp dir, and their descendants):
# `ray stop` would end every Ray process on the machine, other users' included.

CLUSTER_ENV = "TUNING_TEST_RAY_CLUSTER"

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


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def cluster_pids(temp_dir: str) -> list[int]:
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
  while (pids := cluster_pids(temp_dir)) and time.monotonic() < deadline:
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    time.sleep(0.1)


def assert_cluster_on_loopback(temp_dir: str) -> None:
  """Every TCP listener of the cluster's processes is on loopback (and there
  are some: the GCS and the raylets listen)."""
  pids = cluster_pids(temp_dir)
  assert processes.tcp_listeners(pids), "the cluster's services listen on TCP"
  off = [(pid, (processes.cmdline(pid) or b"")[:120], table, address)
         for pid in pids for table, address in processes.tcp_listeners([pid])
         if address not in processes.LOOPBACK]
  assert not off, off


def _start_node(role: str, env: dict, **params) -> None:
  subprocess.run([sys.executable, "-c", _START_NODE, role, json.dumps(params)], check=True,
                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)


def keep_loopback(monkeypatch) -> None:
  """This process, the driver, joins 127.0.0.1:<port> as given: `ray.init`
  would otherwise connect to the machine's outward address, where nothing of
  the cluster listens. What RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 does; Ray reads
  the variable when it is imported, so the value read is patched, for the test
  at hand only."""
  from ray._private import ray_constants

  monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)


def two_node_cluster(monkeypatch):
  """A generator for the `two_node_cluster` fixture (tests/conftest.py): yields
  the head's "127.0.0.1:<port>"; afterwards every process of the cluster has
  ended and its temp dir is gone."""
  keep_loopback(monkeypatch)
  temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths
  port = _free_port()
  env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **{CLUSTER_ENV: temp_dir})
  common = dict(node_ip_address="127.0.0.1", num_cpus=1, dashboard_agent_listen_port=0)
  try:
    _start_node("head", env, gcs_server_port=port, temp_dir=temp_dir, include_dashboard=False,
                **common)
    _start_node("worker", env, gcs_address=f"127.0.0.1:{port}", **common)
    assert_cluster_on_loopback(temp_dir)
    yield f"127.0.0.1:{port}"
    assert_cluster_on_loopback(temp_dir)  # again, with the workers and actors of the test
  finally:
    _stop_cluster(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)
    assert not cluster_pids(temp_dir)
