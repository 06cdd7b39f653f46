"""Connecting to Ray sets none of this process' logging: no logger's level, and
no handler outside Ray's own logger. (With configure_logging=False, `ray.init`
still empties the "ray" logger's handlers; a Ray module it imports sets
"filelock" to WARNING when imported.) The reaper of a local session ends the
processes it was given, and only those, when its stdin closes."""

import os
import re
import subprocess
import sys
import time

import pytest

from tests import process_table as processes
from tff_fedadamom.runtime import ray_session
from tests.helpers import ROOT


# Every logger's level and handlers (the root's included), before and after a
# local Ray session starts, in a fresh interpreter; prints those that changed.
_CODE = """
import logging
from tff_fedadamom.runtime.ray_session import ray_session

def loggers():
  named = dict(logging.root.manager.loggerDict)
  named["<root>"] = logging.root
  return {n: (l.level, () if n == "ray" else tuple(l.handlers), l.propagate)
          for n, l in named.items() if isinstance(l, logging.Logger) and n != "filelock"}

import ray  # its import-time loggers exist before the comparison
before = loggers()
with ray_session(None):
  after = loggers()
changed = {n for n in before if after.get(n) != before[n]}
print(sorted(changed))
"""


def test_a_local_session_leaves_logging_alone():
  env = {**os.environ, "PYTHONPATH": ROOT, "RAY_ADDRESS": ""}
  out = subprocess.run([sys.executable, "-c", _CODE], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_reaper_ends_its_processes_when_its_pipe_closes_and_leaves_a_reused_pid():
  sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
  try:
    killed, spared = (processes.identity(p.pid) for p in sleepers)
    # The second sleeper is named with another start time: a pid reused since.
    reaper = subprocess.Popen(
        [sys.executable, "-I", ray_session.REAPER, f"{killed[0]}:{killed[1]}",
         f"{spared[0]}:{spared[1] + 1}"], stdin=subprocess.PIPE)
    time.sleep(0.5)
    assert reaper.poll() is None  # it waits for the end of its stdin
    assert sleepers[0].poll() is None
    reaper.stdin.close()
    assert reaper.wait(timeout=30) == 0
    assert sleepers[0].wait(timeout=30) == -9
    assert sleepers[1].poll() is None
  finally:
    for p in sleepers:
      p.kill()
      p.wait()


def test_a_local_session_ends_its_reaper_and_every_process_it_started():
  env = {**os.environ, "PYTHONPATH": ROOT, "RAY_ADDRESS": ""}
  code = ("import os\nfrom tests import process_table as processes\n"
          "from tff_fedadamom.runtime import ray_session\n"
          "with ray_session.ray_session(None):\n"
          "  reaper = ray_session._reaper.pid\n"
          "  started = processes.descendants(os.getpid())\n"
          "print(reaper in started, len(started), started)\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  has_reaper, count, started = out.stdout.strip().splitlines()[-1].split(" ", 2)
  assert has_reaper == "True" and int(count) >= 3  # the reaper, GCS, raylet, ...
  pids = [int(p) for p in started.strip("[]").split(",")]
  deadline = time.monotonic() + 20
  while processes.still_running(pids) and time.monotonic() < deadline:
    time.sleep(0.5)
  assert not processes.still_running(pids)


# Ray's shutdown would end the autoscaler monitor last, by SIGTERM, and wait a
# second for it; the session kills it first. Prints whether the monitor still
# ran when `ray.shutdown` was called, and how it ended.
_MONITOR_FIRST = """
import ray
from ray._private import worker
from tests import process_table as processes
from tff_fedadamom.runtime import ray_session
seen, real_shutdown = [], ray.shutdown

def shutdown(*args, **kwargs):
  seen.append(processes.still_running([monitor.pid]))
  return real_shutdown(*args, **kwargs)

with ray_session.ray_session(None):
  monitor = worker._global_node.all_processes["monitor"][0].process
  assert monitor.poll() is None
  ray.shutdown = shutdown
print(seen, monitor.returncode)
"""


def test_a_local_session_kills_its_autoscaler_monitor_before_rays_shutdown():
  env = {**os.environ, "PYTHONPATH": ROOT, "RAY_ADDRESS": ""}
  out = subprocess.run([sys.executable, "-c", _MONITOR_FIRST], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == "[[]] -9"  # gone, by SIGKILL, before


# A local start whose first two `ray.init` calls fail after starting processes
# (as when a GCS server ends before writing its log, seen in the test suite):
# the session names what each failed try left and how it ended (a process Ray
# has already waited for, through Ray's own handle on it), ends what still
# runs, and starts Ray again; the third try succeeds. The pauses between tries
# are shortened.
_FAILING_START = """
import logging, os, subprocess, time, types
import ray
from tests import process_table as processes
from tff_fedadamom.runtime import ray_session
ray_session._PAUSE_BEFORE_TRY_S = (0.0, 0.1, 0.2)
real_init, left = ray.init, []

class Node:  # what Ray's `ray._private.node.Node` holds of its processes
  def __init__(self, gcs):
    self.all_processes = {"gcs_server": [types.SimpleNamespace(process=gcs)]}

  def start(self):
    raise FileNotFoundError("gcs_server.err")

def init(**kwargs):
  if len(left) < 2:
    sleeper = subprocess.Popen(["sleep", "60"])
    exited = subprocess.Popen(["sh", "-c", "exit 70"])
    gcs = subprocess.Popen(["sh", "-c", "kill -9 $$"])
    gcs.wait()  # reaped: only the handle knows how it ended
    while processes.stat(exited.pid).running:
      time.sleep(0.02)
    left.append((sleeper, exited, gcs))
    Node(gcs).start()
  return real_init(**kwargs)
ray.init = init
logging.basicConfig()
with ray_session.ray_session(None):
  print(ray.is_initialized(), *(f"{s.pid} {e.pid} {g.pid} {s.poll()}" for s, e, g in left),
        flush=True)
"""


def test_a_local_start_that_fails_twice_is_tried_a_third_time():
  env = {**os.environ, "PYTHONPATH": ROOT, "RAY_ADDRESS": ""}
  out = subprocess.run([sys.executable, "-c", _FAILING_START], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  line = out.stdout.strip().splitlines()[-1].split(" ")
  assert line[0] == "True"
  warnings = [w for w in out.stderr.splitlines()
              if "a local Ray failed to start (FileNotFoundError: gcs_server.err)" in w]
  assert len(warnings) == 2, out.stderr[-3000:]
  tries = [line[i:i + 4] for i in range(1, len(line), 4)]
  for warning, (sleeper, exited, gcs, code), pause in zip(warnings, tries, ("0.1", "0.2")):
    # Each try's own processes; the one still running was killed (-9: its Popen's poll).
    assert code == "-9"
    # The sleeper's state letter is whichever it was then (S, or R or D while it started).
    assert re.search(rf"sleep {sleeper} \(runs \([A-Z]\)\)", warning), warning
    for said in (f"sh {exited} (exited with code 70)", f"gcs_server {gcs} (killed by signal 9)"):
      assert said in warning, warning
    assert warning.endswith(f"starting it again in {pause} s"), warning
  assert tries[0][0] not in warnings[1]


def test_resources_are_told_to_a_new_local_ray_only():
  with pytest.raises(ValueError, match=r"resources=\{'num_gpus': 1\} apply to a new local "
                                       r"Ray only, not to address='auto'"):
    ray_session.connect("auto", resources={"num_gpus": 1})
