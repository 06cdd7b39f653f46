"""The process-table reader, on processes this test starts itself."""

import os
import subprocess
import sys
import time

from tests import process_table as processes

# A child that starts a grandchild, prints the grandchild's pid, then waits.
_TREE = ("import subprocess, sys, time\n"
         "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "print(g.pid, flush=True)\n"
         "time.sleep(60)\n")


def test_descendants_find_children_and_grandchildren():
  child = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE,
                           env=dict(os.environ, PROCESSES_TEST_MARK="1"))
  try:
    grandchild = int(child.stdout.readline())
    assert set(processes.descendants(os.getpid())) >= {child.pid, grandchild}
    assert processes.descendants(child.pid) == [grandchild]
    assert processes.descendants([child.pid, grandchild]) == []
    assert processes.stat(grandchild).ppid == child.pid
    # Popen returns once the exec has begun (the error pipe closes on exec);
    # the kernel fills in the new program's arguments a moment later, and
    # until then /proc/PID/cmdline is empty (seen once in CI, under load).
    deadline = time.monotonic() + 10
    while not processes.cmdline(grandchild) and time.monotonic() < deadline:
      time.sleep(0.01)
    assert b"time.sleep(60)" in processes.cmdline(grandchild)
    assert b"PROCESSES_TEST_MARK=1" in processes.environ(child.pid)
    assert processes.still_running([child.pid, grandchild]) == [child.pid, grandchild]
  finally:
    child.kill()
    child.wait()
  # The grandchild, orphaned, is reaped by init; until it is killed it runs.
  assert processes.still_running([child.pid]) == []
  os.kill(grandchild, 9)
  deadline = time.monotonic() + 10
  while processes.still_running([grandchild]) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert processes.still_running([grandchild]) == []


def _until_ended(child: subprocess.Popen) -> subprocess.Popen:
  """`child`, once it has ended (a zombie: not reaped, its Popen not polled),
  or after 10 s."""
  deadline = time.monotonic() + 10
  while processes.stat(child.pid).running and time.monotonic() < deadline:
    time.sleep(0.02)
  return child


def test_a_zombie_has_no_identity_but_a_stat():
  child = _until_ended(subprocess.Popen([sys.executable, "-c", "pass"]))
  zombie = processes.stat(child.pid)
  assert zombie.state == "Z" and not zombie.running
  assert processes.identity(child.pid) is None
  child.wait()
  assert processes.stat(child.pid) is None


def test_identity_tells_a_running_process():
  me = processes.identity(os.getpid())
  assert me[0] == os.getpid()
  # The start time is after boot and does not change while the process runs.
  assert me[1] > 0 and processes.identity(os.getpid()) == me
  assert os.getpid() in processes.pids()
  assert processes.identity(2 ** 22 + 12345) is None  # above the kernel's pid_max


def test_listening_sees_a_tcp_listener_and_a_bound_udp_socket_of_this_process():
  import socket

  def ours(port, table):
    return [entry for entry in processes.listening([os.getpid()])
            if entry[0] == table and entry[1].endswith(f":{port:04X}")]

  tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
  try:
    tcp.bind(("127.0.0.1", 0))
    port = tcp.getsockname()[1]
    assert ours(port, "tcp") == []  # bound, not yet listening
    tcp.listen()
    udp.bind(("127.0.0.1", 0))
    assert ours(port, "tcp") == [("tcp", f"0100007F:{port:04X}")]
    assert len(ours(udp.getsockname()[1], "udp")) == 1
  finally:
    tcp.close()
    udp.close()
  assert ours(port, "tcp") == []


def test_how_a_process_ended_is_read_from_its_zombie():
  exited = _until_ended(subprocess.Popen(["sh", "-c", "exit 70"]))
  killed = subprocess.Popen(["sleep", "60"])
  try:
    running = processes.stat(killed.pid)
    assert running.name == "sleep" and running.wait_status is None
    # Its state letter, whichever it is this moment (S sleeping, R, D while paged in).
    assert processes.how_it_ended(running) == f"runs ({running.state})" != "runs (Z)"
    killed.kill()
    assert processes.how_it_ended(processes.stat(_until_ended(killed).pid)) == \
        "killed by signal 9"
    zombie = processes.stat(exited.pid)
    assert zombie.name == "sh" and zombie.wait_status == 70 << 8
    assert processes.how_it_ended(zombie) == "exited with code 70"
  finally:
    for child in (exited, killed):
      child.kill()
      child.wait()
