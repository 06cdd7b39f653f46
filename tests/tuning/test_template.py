"""`tuning.template`: a sweep driver forked into its node's template, which the
local host's workers are forked from, only where the fork is safe, and never
outliving its session or its driver. Each case runs in a new Python process:
the test process has started TensorFlow's runtime."""

import json
import os
import subprocess
import sys
import time

from tff_fedadamom import process_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(code: str, tmpdir=None) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": ROOT, **({"TMPDIR": str(tmpdir)} if tmpdir else {})}
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env=env)


def _ended(pid: int, within_s: float = 10.0) -> bool:
  deadline = time.monotonic() + within_s
  while process_table.still_running([pid]):
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)
  return True


def test_a_driver_is_forked_only_where_safe_and_a_host_outlives_its_template():
  """Forked only where a fork is safe, writing the driver's buffered output
  once; with its template gone, a host's next worker comes from a fork server
  of the host's own."""
  done = _python("""
import json, os, threading
import tuning.worker_imports
from tuning.hosts import WorkerHost
from tuning.template import node_template
print("written once before the fork")  # buffered: stdout is a pipe
seen = {}
with node_template() as template:
  seen["imported"] = template is not None
  host = WorkerHost(template)
  os.kill(template.identity[0], 9)
  os.waitpid(template.identity[0], 0)
  pid = host.start_worker("w", 1, [], 1, b"")
  status = open(f"/proc/{pid}/status").read()
  parent = int(next(l for l in status.splitlines() if l.startswith("PPid:")).split()[1])
  seen["a worker after its template"] = (host.run("w", os.getpid) == pid
                                         and parent != template.identity[0])
  host.shutdown()
stop = threading.Event()
thread = threading.Thread(target=stop.wait)
thread.start()
with node_template() as template:
  seen["a thread of its own"] = template is not None
stop.set(); thread.join()
import tensorflow as tf
tf.constant(1.0) + 1.0
with node_template() as template:
  seen["runtime started"] = template is not None
print(json.dumps(seen))
""")
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.splitlines()
  assert lines.count("written once before the fork") == 1
  assert json.loads(lines[-1]) == {"imported": True, "a worker after its template": True,
                                   "a thread of its own": False, "runtime started": False}


def test_the_template_ends_with_its_driver():
  done = _python("""
import os, signal, sys
import tuning.worker_imports
from tuning.template import node_template
with node_template() as template:
  print(template.identity[0], flush=True)
  os.kill(os.getpid(), signal.SIGKILL)
""")
  assert done.returncode == -9
  assert _ended(int(done.stdout.split()[0]))


def test_a_hosts_worker_is_the_templates_and_gives_a_plain_runs_numbers(tmp_path):
  (tmp_path / "tmp").mkdir()
  """The host's worker is the template's child, in the template's process group
  (a Ctrl-C at the driver's terminal is the driver's to handle); forked from
  the driver, which imported with the driver's environment, it computes what
  a run in a process of its own computes; all end with the session."""
  done = _python(f"""
import json, os, uuid
import tuning.worker_imports
from ray import cloudpickle
from tff_fedadamom import process_table
from tuning.hosts import WorkerHost
from tuning.template import node_template

def experiment(name):
  return {{"seed": 0, "rounds": 3, "clients_per_round": 3, "eval_every": 1,
           "telemetry": False, "output_dir": os.path.join({str(tmp_path)!r}, name),
           "data": {{"name": "digits", "num_clients": 6}}, "model": {{"name": "logistic"}},
           "client": {{"learning_rate": 0.1, "batch_size": 20}},
           "server": {{"optimizer": "fedadamom", "learning_rate": 1.0, "beta_2": 0.05}},
           "runtime": {{"threads": 1}}}}

KEYS = ("train/loss", "test/loss", "test/accuracy")
with node_template() as template:
  host = WorkerHost(template)
  pid = host.start_worker("w", 1, [], 1, b"")
  status = open(f"/proc/{{pid}}/status").read()
  parent = int(next(l for l in status.splitlines() if l.startswith("PPid:")).split()[1])
  ran_in = host.run("w", os.getpid)
  token = uuid.uuid4().hex
  assert host.call("w", "claim", token, process_table.identity(os.getpid()))
  callables = cloudpickle.dumps((lambda: experiment("worker"),
                                 lambda event: [float(event.metrics[k]) for k in KEYS], None))
  host.call("w", "start", token, callables, os.path.join({str(tmp_path)!r}, "scratch"))
  worker = []
  while True:
    kind, payload = host.call("w", "next_event", token)
    if kind != "eval":
      assert kind == "done", payload
      break
    worker.append(payload)
  host.call("w", "release", token)
  group = os.getpgid(template.identity[0])
  host.shutdown()

from tff_fedadamom.experiment import run_experiment
from tff_fedadamom.session import Session
Session(threads=1).apply()  # this script is its process's entry point
plain = []
run_experiment(experiment("plain"), progress=False, model_and_plot=False,
               on_eval=lambda event: plain.append([float(event.metrics[k]) for k in KEYS]))
print(json.dumps({{"worker": worker, "plain": plain, "template": template.identity[0],
                  "parent": parent, "pid": pid, "ran_in": ran_in, "group": group,
                  "driver_group": os.getpgid(0), "socket": template.address}}))
""", tmpdir=tmp_path / "tmp")
  assert done.returncode == 0, done.stderr[-3000:]
  seen = json.loads(done.stdout.splitlines()[-1])
  assert seen["parent"] == seen["template"] and seen["ran_in"] == seen["pid"]
  assert seen["group"] == seen["template"] != seen["driver_group"]
  assert len(seen["plain"]) == 3
  assert seen["worker"] == seen["plain"]  # bit for bit
  assert _ended(seen["template"]) and _ended(seen["pid"])
  # The killed workers' files (manager sockets, AutoGraph sources) went with their host's.
  assert os.listdir(tmp_path / "tmp") == []
  assert not os.path.exists(os.path.dirname(seen["socket"]))
