"""The tff_cpp backend (runtime/tff_cpp.py): TFF's worker_binary listens on nothing
reachable from this network namespace, ends with the run (or its parent),
cannot hang its parent's exit, and the run changes no process-wide state."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import process_table as processes
from tests.helpers import relay_and_worker, tiny
from tff_fedadamom.config import ConfigError, load_config
from tff_fedadamom.experiment import parts as parts_lib
from tff_fedadamom import runtime as backends
from tff_fedadamom.experiment import run_experiment
from tff_fedadamom.runtime import tff_cpp

TFF_CPP = {"backend": "tff_cpp"}


def _interfaces(pid):
  """The network interfaces of process `pid`'s namespace."""
  with open(f"/proc/{pid}/net/dev") as f:
    return {line.split(":")[0].strip() for line in f.readlines()[2:]}


@pytest.fixture(scope="module")
def observed_run(tmp_path_factory):
  """A 2-round tff_cpp run in this process, what it looked like after round 1
  (its worker's sockets and namespace), and TFF's default context around it."""
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl

  seen = {}
  ours = set(processes.descendants(os.getpid()))  # the session's default context's

  def on_round(round_num, metrics):
    if round_num == 1:
      relay, worker = relay_and_worker(set(processes.descendants(os.getpid())) - ours)
      seen.update(
          relay=relay, worker=worker, env=processes.environ(worker),
          host=processes.tcp_listeners([relay, worker]),
          own=processes.tcp_listeners([worker], namespace_of=worker),
          netns=os.readlink(f"/proc/{worker}/ns/net"), interfaces=_interfaces(worker),
          during=context_stack_impl.context_stack.current)

  before = context_stack_impl.context_stack.current
  env_before = dict(os.environ)
  result = run_experiment(tiny(tmp_path_factory.mktemp("tff_cpp") / "run", rounds=2,
                               runtime=TFF_CPP), progress=False, on_round=on_round)
  return dict(seen, result=result, before=before,
              after=context_stack_impl.context_stack.current,
              env_changed=dict(os.environ) != env_before)


def test_the_worker_listens_on_nothing_in_this_network_namespace(observed_run):
  assert observed_run["result"].summary["status"] == "completed"
  # No TCP listener of the relay or the worker is in this namespace's tables...
  assert observed_run["host"] == []
  # ...though the worker does listen, on every interface of its own namespace
  # ([::]), which is another namespace, with a loopback and nothing else.
  assert observed_run["own"], "the worker should listen in its own namespace"
  assert {address for _, address in observed_run["own"]} - processes.LOOPBACK
  assert observed_run["netns"] != os.readlink("/proc/self/ns/net")
  assert observed_run["interfaces"] == {"lo"}


def test_the_worker_has_single_threaded_kernels_and_this_process_no_new_env(observed_run):
  env = dict(item.split(b"=", 1) for item in observed_run["env"])
  assert env[b"TF_NUM_INTRAOP_THREADS"] == b"1" and env[b"OMP_NUM_THREADS"] == b"1"
  assert not observed_run["env_changed"]


def test_a_run_leaves_tff_default_context_and_no_process(observed_run):
  assert observed_run["after"] is observed_run["before"]
  assert observed_run["during"] is observed_run["before"]  # between the calls, too
  assert processes.still_running([observed_run["relay"], observed_run["worker"]]) == []


def test_no_namespace_is_one_config_error_before_any_round(tmp_path, monkeypatch):
  monkeypatch.setattr(tff_cpp, "namespace_problem",
                      lambda: "unshare(CLONE_NEWUSER | CLONE_NEWNET): Operation not permitted")
  children = processes.descendants(os.getpid())
  with pytest.raises(ConfigError) as error:
    run_experiment(tiny(tmp_path / "run", rounds=2, runtime=TFF_CPP), progress=False)
  message = str(error.value)
  assert "runtime.backend" in message and "'inprocess' or 'ray'" in message
  assert "every network interface" in message and "Operation not permitted" in message
  assert not (tmp_path / "run" / "metrics.csv").exists()
  assert processes.descendants(os.getpid()) == children


@pytest.fixture(scope="module")
def wrapped(tmp_path_factory):
  config = load_config(tiny(tmp_path_factory.mktemp("wrapped") / "run", runtime=TFF_CPP))
  process = parts_lib.build_parts(config).process
  assert isinstance(process, tff_cpp.TffCppProcess)
  yield process
  process.close()


def test_calls_from_another_thread_run_on_the_same_worker(wrapped):
  here = wrapped.initialize()
  there = {}
  thread = threading.Thread(target=lambda: there.update(state=wrapped.initialize()))
  thread.start()
  thread.join()
  for a, b in zip(tf.nest.flatten(here), tf.nest.flatten(there["state"]), strict=True):
    np.testing.assert_array_equal(a, b)
  assert wrapped.initialize.type_signature is not None  # the computation's own attributes


def test_close_ends_the_worker_and_is_idempotent(wrapped):
  wrapped.initialize()
  worker = wrapped.runtime.worker_binary
  pids = [worker.relay_pid, worker.pid]
  assert processes.still_running(pids) == pids
  socket_dir = os.path.dirname(worker.path)
  assert os.stat(socket_dir).st_mode & 0o077 == 0  # the socket's directory is ours alone
  # gRPC's connectivity poller of the channel (TFF's stub subscribes to it) has
  # stopped when the channel closes: a poller still running then can raise in
  # its thread ("Channel closed!"), printed to stderr.
  poller = wrapped.runtime._channel._connectivity_state  # noqa: SLF001 - gRPC's own
  assert poller.polling
  wrapped.close()
  assert not poller.polling
  wrapped.close()
  assert processes.still_running(pids) == []
  assert not os.path.exists(socket_dir)
  with pytest.raises(RuntimeError, match="closed"):
    wrapped.initialize()


def test_the_backend_starts_nothing_before_its_first_call(tmp_path):
  plan = parts_lib.make_plan(tiny(tmp_path, runtime=TFF_CPP))
  wrapper = backends.build_backend(plan, object())
  assert isinstance(wrapper, tff_cpp.TffCppProcess)
  assert wrapper.runtime.worker_binary is None  # nothing started before the first call
  with pytest.raises(TypeError, match="client_tensors"):  # rounds build data from tensors
    wrapper.next_for_clients(None, ["c0"], 1)
  wrapper.close()


# ------------------------------------------------------------------ stopping


def _group_leader(code: str) -> subprocess.Popen:
  """A process leading its own group, as the relay does, running `code`; it has
  printed its first line when this returns."""
  child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, start_new_session=True, text=True)
  child.first_line = child.stdout.readline().strip()
  return child


def test_stop_kills_a_relay_that_ignores_sigterm(tmp_path):
  relay = _group_leader("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                        "print('ready', flush=True); time.sleep(600)")
  started = time.monotonic()
  tff_cpp._stop(relay, str(tmp_path), [], timeout_s=1.0)
  assert relay.returncode == -9  # killed, not left waiting for its 600 s sleep
  assert time.monotonic() - started < 30
  assert not tmp_path.exists()


def test_stop_does_not_cut_a_clean_exit_short(tmp_path):
  relay = _group_leader("import signal, sys, time\n"
                        "def end(*_):\n  time.sleep(0.5)\n  sys.exit(0)\n"
                        "signal.signal(signal.SIGTERM, end)\n"
                        "print('ready', flush=True)\ntime.sleep(600)")
  tff_cpp._stop(relay, str(tmp_path), [], timeout_s=30.0)
  assert relay.returncode == 0


def test_stop_kills_a_worker_that_outlives_its_relay(tmp_path):
  # The "relay" starts a grandchild that ignores SIGTERM and has no parent death
  # signal, prints its pid, and ends on SIGTERM itself.
  relay = _group_leader(
      "import subprocess, sys, time\n"
      "code = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
      "time.sleep(600)'\n"
      "worker = subprocess.Popen([sys.executable, '-c', code])\n"
      "time.sleep(0.5)\nprint(worker.pid, flush=True)\ntime.sleep(600)")
  worker = processes.identity(int(relay.first_line))
  assert worker is not None
  started = time.monotonic()
  tff_cpp._stop(relay, str(tmp_path), [worker], timeout_s=1.0)
  assert time.monotonic() - started < 30
  deadline = time.monotonic() + 10
  while processes.identity(worker[0]) == worker and time.monotonic() < deadline:
    time.sleep(0.1)
  assert processes.identity(worker[0]) != worker


def test_a_killed_owner_leaves_no_worker_and_no_socket_directory():
  """A process that started a worker_binary is killed (SIGKILL) before it could
  close it: the relay sees its stdin end, ends the worker and itself, and
  removes the socket and its directory."""
  owner = subprocess.Popen(
      [sys.executable, "-c",
       "import os, time\n"
       "from tff_fedadamom.runtime import tff_cpp\n"
       "worker = tff_cpp.WorkerBinary()\n"
       "print(worker.relay_pid, worker.pid, os.path.dirname(worker.path), flush=True)\n"
       "time.sleep(600)"],
      stdout=subprocess.PIPE, text=True)
  relay, worker, socket_dir = owner.stdout.readline().split()
  pids = [int(relay), int(worker)]
  assert processes.still_running(pids) == pids and os.path.isdir(socket_dir)
  owner.kill()
  owner.wait()
  deadline = time.monotonic() + 30
  while (processes.still_running(pids) or os.path.exists(socket_dir)) and \
      time.monotonic() < deadline:
    time.sleep(0.1)
  assert processes.still_running(pids) == []
  assert not os.path.exists(socket_dir)


# The relay's end, in a process of its own (it exits): called by two threads at
# once, as when the parent is killed and the worker ends with it, after the
# socket is gone (the state the second of two racing callers used to find).
_END_TWICE = """
import os, subprocess, sys, threading, time
from tff_fedadamom.runtime import tff_cpp_relay as relay
socket_dir = sys.argv[1]
worker = subprocess.Popen(["sleep", "60"])
print(worker.pid, flush=True)
for _ in range(2):
  threading.Thread(target=relay._end, args=(worker, 7, os.path.join(socket_dir, "s"))).start()
time.sleep(60)
"""


def test_the_relay_ends_once_and_removes_its_directory_without_a_socket(tmp_path):
  socket_dir = tmp_path / "tff-cpp-x"
  socket_dir.mkdir()
  ended = subprocess.run([sys.executable, "-c", _END_TWICE, str(socket_dir)],
                         capture_output=True, text=True, timeout=60)
  assert ended.returncode == 7, ended.stderr
  assert not socket_dir.exists()
  assert processes.still_running([int(ended.stdout.split()[0])]) == []
